// etcdctl of the release this module pins: the tests read raw keys with it (`etcdctl get`), as the issue's
// checks of what is stored are written.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() {
	ctlv3.MustStart()
}
