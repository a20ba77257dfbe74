// kube-apiserver of the release this module pins, as `make kube` builds it for the real-cluster tests and
// `make cluster`. The blank imports register what upstream's own binary registers: the JSON log format and the
// client-go and version metrics, so that /metrics names match a release.
//
// One test-only difference from a release (docs/reference/differences.md): KUBE_ENCRYPTION_CONFIG_POLL, a Go
// duration, sets how often the --encryption-provider-config file is checked for changes with automatic reload on
// (a minute in a release), so that the key-rotation tests need not wait a minute per step.
package main

import (
	"fmt"
	"os"
	"time"
	_ "time/tzdata"

	"k8s.io/apiserver/pkg/server/options/encryptionconfig/controller"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	if poll := os.Getenv("KUBE_ENCRYPTION_CONFIG_POLL"); poll != "" {
		d, err := time.ParseDuration(poll)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "KUBE_ENCRYPTION_CONFIG_POLL=%q: not a positive Go duration\n", poll)
			os.Exit(2)
		}
		controller.EncryptionConfigFileChangePollDuration = d
	}
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
