#!/usr/bin/env bash
# `make cluster` / `make cluster-down`: a real local Kubernetes cluster with migration-apiserver in it, for users and
# the tests alike (tests/common/cluster.rs runs this script). Every process listens on 127.0.0.1 only.
#
#   scripts/cluster.sh up      etcd, kube-apiserver, kube-controller-manager, then this server, registered by the
#                              deploy kit (scripts/deploy.sh with LOCAL_PORT: the Service is an ExternalName of
#                              localhost, and no Deployment, PVC or PDB; docs/install/local-cluster.md)
#   scripts/cluster.sh down    stops them all (what `up` started, by the pids it wrote)
#   scripts/cluster.sh stop NAME / restart NAME   stops one process (etcd, kube-apiserver, kube-controller-manager,
#                              migration-apiserver), or starts it again as it was started and waits until it serves
#
# Settings (environment):
#   CLUSTER_DIR    where everything lives: certificates, configs, data, logs, pids (default target/cluster)
#   KUBE_BIN_DIR   kube-apiserver, kube-controller-manager, kubectl, etcd, etcdctl (`make kube`)
#   MIGRATION_APISERVER  this server's binary (default target/release/migration-apiserver)
#   INTREE=off     kube-apiserver without storagemigration.k8s.io (the group served by this server instead)
#   FORM=crds      the CRD-and-webhook form in place of the APIServices
#   SERVER=off     no migration-apiserver: the bare cluster (the anchors' cases, and tests that start their own)
#   SERVER_ARGS    further `serve` flags for this server
#   KUBE_APISERVER_ARGS  further kube-apiserver flags
#   KCM_ARGS       further kube-controller-manager flags
#   CLUSTER_OWNER_PID    stop the cluster when this process ends (the tests' harness sets it), and with
#                        CLUSTER_REMOVE_DIR=1 remove $CLUSTER_DIR then
# The ports are free ones chosen at `up` and written to $CLUSTER_DIR/cluster.env.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER_DIR=${CLUSTER_DIR:-$root/target/cluster}
KUBE_BIN_DIR=${KUBE_BIN_DIR:-$root/target/kube/v1.37.2}
MIGRATION_APISERVER=${MIGRATION_APISERVER:-$root/target/release/migration-apiserver}
INTREE=${INTREE:-on}
FORM=${FORM:-aggregated}
SERVER=${SERVER:-on}
SERVER_ARGS=${SERVER_ARGS:-}
KUBE_APISERVER_ARGS=${KUBE_APISERVER_ARGS:-}
KCM_ARGS=${KCM_ARGS:-}
NAMESPACE=migration-apiserver

pki=$CLUSTER_DIR/pki
export PATH="$KUBE_BIN_DIR:$PATH"

# Whether process `pid` runs (a zombie, ended but not yet reaped by its new parent, does not).
alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ "$state" != Z* ]]
}

# Stops what `up` started, newest first.
down() {
  [ -d "$CLUSTER_DIR/pids" ] || return 0
  local name
  for name in migration-apiserver kube-controller-manager kube-apiserver $(ls "$CLUSTER_DIR/pids") etcd owner-watch; do
    # The owner watch itself runs this `down`: it ends by itself after it.
    if [ "$name" = owner-watch ] && [ "$(cat "$CLUSTER_DIR/pids/$name" 2>/dev/null)" = "$PPID" ]; then continue; fi
    stop_one "$name"
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Polls `what` (a command) until it succeeds, for at most `seconds`; on time-out shows the log and fails.
wait_for() {
  local seconds=$1 log=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "not ready within ${seconds}s: $*; the end of $log:" >&2
      tail -n 30 "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
}

# Starts a long-running process in the background with its log and pid under $CLUSTER_DIR; its command line is
# kept (cmds/<name>, NUL-separated) for `restart`.
start() {
  local name=$1
  shift
  mkdir -p "$CLUSTER_DIR/cmds"
  printf '%s\0' "$@" > "$CLUSTER_DIR/cmds/$name"
  "$@" >> "$CLUSTER_DIR/logs/$name.log" 2>&1 &
  echo $! > "$CLUSTER_DIR/pids/$name"
}

# Stops one process of the cluster (SIGTERM, then SIGKILL after 10 s).
stop_one() {
  local name=$1 pid deadline
  [ -f "$CLUSTER_DIR/pids/$name" ] || return 0
  pid=$(cat "$CLUSTER_DIR/pids/$name")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    ! alive "$pid" || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$CLUSTER_DIR/pids/$name"
}

# Starts a process again with the command line it was started with, and waits until it serves.
restart_one() {
  local name=$1
  [ -f "$CLUSTER_DIR/cmds/$name" ] || { echo "no process $name in $CLUSTER_DIR" >&2; exit 1; }
  # shellcheck disable=SC1091
  . "$CLUSTER_DIR/cluster.env"
  stop_one "$name"
  local -a cmd
  mapfile -d '' cmd < "$CLUSTER_DIR/cmds/$name"
  start "$name" "${cmd[@]}"
  ready "$name"
}

# Waits until a process of the cluster serves.
ready() {
  local log=$CLUSTER_DIR/logs/$1.log
  case "$1" in
    etcd) wait_for 30 "$log" etcdctl --endpoints "127.0.0.1:$ETCD_PORT" endpoint health ;;
    kube-apiserver) wait_for 90 "$log" kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" get --raw /readyz ;;
    kube-controller-manager) wait_for 60 "$log" curl -sfk "https://127.0.0.1:$KCM_PORT/healthz" ;;
    migration-apiserver)
      wait_for 60 "$log" curl -sf --cacert "$CLUSTER_DIR/migration-apiserver/certs/ca.crt" \
        "https://127.0.0.1:$SERVER_PORT/readyz" ;;
  esac
}

# A key and a certificate signed by CA `ca` (ca.crt, ca.key in $pki): subject `subj`, SANs `sans` (may be empty),
# for clientAuth or serverAuth.
issue() {
  local name=$1 ca=$2 subj=$3 usage=$4 sans=${5:-}
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [ -z "$sans" ] || echo "subjectAltName=$sans"
  } > "$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial -days 365 \
    -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

ca() {
  local name=$1 cn=$2
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "/CN=$cn" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/$name.crt" 2>/dev/null
}

# A kubeconfig for kube-apiserver with a client certificate (`cert`) or a bearer token (`token:<value>`).
kubeconfig() {
  local file=$1 user=$2 credential=$3
  {
    echo "apiVersion: v1"
    echo "kind: Config"
    echo "clusters:"
    echo "- name: local"
    echo "  cluster: {server: 'https://127.0.0.1:$API_PORT', certificate-authority: '$pki/ca.crt'}"
    echo "users:"
    echo "- name: $user"
    case "$credential" in
      token:*) echo "  user: {token: '${credential#token:}'}" ;;
      *) echo "  user: {client-certificate: '$pki/$credential.crt', client-key: '$pki/$credential.key'}" ;;
    esac
    echo "contexts:"
    echo "- name: local"
    echo "  context: {cluster: local, user: $user}"
    echo "current-context: local"
  } > "$file"
  chmod 600 "$file"
}

pki_up() {
  mkdir -p "$pki"
  [ -f "$pki/ca.crt" ] && return 0
  ca ca migration-apiserver-local-cluster-ca
  ca front-proxy-ca migration-apiserver-local-front-proxy-ca
  issue kube-apiserver ca /CN=kube-apiserver serverAuth \
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1"
  issue admin ca "/O=system:masters/CN=kubernetes-admin" clientAuth
  issue nobody ca "/CN=nobody" clientAuth
  issue kube-controller-manager ca /CN=system:kube-controller-manager clientAuth
  issue front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth
  # The identity kube-apiserver's webhook client presents to our admission webhooks (manifests/webhooks/README.md).
  issue webhook-client ca /CN=migration-apiserver-webhook-client clientAuth
  openssl genrsa -out "$pki/service-account.key" 2048 2>/dev/null
  openssl rsa -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null
}

etcd_up() {
  start etcd etcd --name local --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT"
  ready etcd
}

# The encryption config kube-apiserver reloads when it changes (tests rewrite it: key rotation). Secrets start in
# the clear (identity), as in a cluster that has not turned encryption on yet.
encryption_config() {
  [ -f "$CLUSTER_DIR/encryption-config.yaml" ] && return 0
  cat > "$CLUSTER_DIR/encryption-config.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - identity: {}
EOF
}

# kube-apiserver's audit policy: Metadata for every request but the noisy read-only ones of the control plane's own
# loops, without the RequestReceived stage (as GKE's and upstream's example policies). The reviews aggregated
# servers send (TokenReview, SubjectAccessReview) at Request level, so that the audit log shows whom they asked about.
audit_policy() {
  cat > "$CLUSTER_DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: [system:kube-controller-manager, system:apiserver]
    verbs: [get, list, watch]
  - level: Request
    resources:
      - group: authorization.k8s.io
        resources: [subjectaccessreviews]
      - group: authentication.k8s.io
        resources: [tokenreviews]
  - level: Metadata
EOF
}

# kube-apiserver's admission plugins present a client certificate to our webhooks, as manifests/webhooks/README.md
# tells a cluster to: an AdmissionConfiguration pointing both webhook plugins at a kubeconfig whose user is named
# after our Service, with the port, since it is not 443 (k8s.io/apiserver's webhook authentication resolver looks
# up `<service>.<namespace>.svc:<port>`, and without the port only for 443).
admission_config() {
  cat > "$CLUSTER_DIR/webhook.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users:
  - name: migration-apiserver.migration-apiserver.svc:$SERVER_PORT
    user:
      client-certificate: $pki/webhook-client.crt
      client-key: $pki/webhook-client.key
EOF
  local plugin
  {
    echo "apiVersion: apiserver.config.k8s.io/v1"
    echo "kind: AdmissionConfiguration"
    echo "plugins:"
    for plugin in ValidatingAdmissionWebhook MutatingAdmissionWebhook; do
      echo "  - name: $plugin"
      echo "    configuration:"
      echo "      apiVersion: apiserver.config.k8s.io/v1"
      echo "      kind: WebhookAdmissionConfiguration"
      echo "      kubeConfigFile: $CLUSTER_DIR/webhook.kubeconfig"
    done
  } > "$CLUSTER_DIR/admission-config.yaml"
}

kube_apiserver_up() {
  local runtime_config="storagemigration.k8s.io/v1=true"
  [ "$INTREE" = off ] && runtime_config="storagemigration.k8s.io/v1=false,storagemigration.k8s.io/v1beta1=false"
  # --bind-address/--advertise-address 127.0.0.1 and --endpoint-reconciler-type=none: kube-apiserver would otherwise
  # write the machine's external address into default/kubernetes. --enable-aggregator-routing=false (the default):
  # the aggregator resolves our ExternalName Service to https://localhost:<port>, and checks the name
  # migration-apiserver.migration-apiserver.svc in our serving certificate.
  # shellcheck disable=SC2086
  start kube-apiserver env KUBE_ENCRYPTION_CONFIG_POLL="${KUBE_ENCRYPTION_CONFIG_POLL:-}" kube-apiserver \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --endpoint-reconciler-type=none --service-cluster-ip-range=10.0.0.0/24 \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --cert-dir="$CLUSTER_DIR/kube-apiserver" \
    --tls-cert-file="$pki/kube-apiserver.crt" --tls-private-key-file="$pki/kube-apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$pki/service-account.pub" \
    --service-account-signing-key-file="$pki/service-account.key" \
    --authorization-mode=RBAC \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-uid-headers=X-Remote-Uid --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
    --enable-aggregator-routing=false \
    --encryption-provider-config="$CLUSTER_DIR/encryption-config.yaml" \
    --encryption-provider-config-automatic-reload \
    --audit-policy-file="$CLUSTER_DIR/audit-policy.yaml" --audit-log-path="$CLUSTER_DIR/logs/kube-apiserver-audit.log" \
    --admission-control-config-file="$CLUSTER_DIR/admission-config.yaml" \
    --runtime-config="$runtime_config" \
    $KUBE_APISERVER_ARGS
  ready kube-apiserver
}

kube_controller_manager_up() {
  local controllers="*"
  [ "$INTREE" = off ] && controllers="*,-storage-version-migrator-controller"
  # shellcheck disable=SC2086
  start kube-controller-manager kube-controller-manager \
    --kubeconfig="$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$CLUSTER_DIR/kube-controller-manager" \
    --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file="$pki/service-account.key" --root-ca-file="$pki/ca.crt" \
    --controllers="$controllers" \
    $KCM_ARGS
  ready kube-controller-manager
}

# This server, registered by the deploy kit as a local process: the kit's namespace, ServiceAccount, RBAC, roles
# and APIServices (or CRDs and webhooks), with the Service an ExternalName of localhost and our port in the
# APIServices. The process authenticates as the kit's ServiceAccount (a token from `kubectl create token`), so that
# a rule missing from the kit's RBAC shows here as it would in the Deployment.
server_up() {
  local certs=$CLUSTER_DIR/migration-apiserver/certs data=$CLUSTER_DIR/migration-apiserver/data
  mkdir -p "$certs" "$data"
  "$MIGRATION_APISERVER" certs --cert-dir "$certs" --service-namespace "$NAMESPACE" \
    --server "https://127.0.0.1:$SERVER_PORT" > /dev/null
  KUBECONFIG="$CLUSTER_DIR/admin.kubeconfig" CERT_DIR="$certs" FORM="$FORM" LOCAL_PORT="$SERVER_PORT" \
    MIGRATION_APISERVER="$MIGRATION_APISERVER" bash "$root/scripts/deploy.sh" > "$CLUSTER_DIR/logs/deploy.log" 2>&1 \
    || { cat "$CLUSTER_DIR/logs/deploy.log" >&2; exit 1; }
  local token
  token=$(kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" -n "$NAMESPACE" create token migration-apiserver \
    --duration=48h)
  kubeconfig "$CLUSTER_DIR/migration-apiserver.kubeconfig" "system:serviceaccount:$NAMESPACE:migration-apiserver" \
    "token:$token"
  local runtime_config
  runtime_config=$(cat "$certs/deploy/runtime-config")
  # As the Deployment runs it (manifests/deployment.yaml), but on 127.0.0.1 and with the kubeconfigs that stand
  # in for the in-cluster configuration.
  # shellcheck disable=SC2086
  start migration-apiserver "$MIGRATION_APISERVER" serve --bind-address=127.0.0.1 --secure-port="$SERVER_PORT" \
    --data-dir="$data" --cert-dir="$certs" \
    --tls-cert-file="$certs/apiserver.crt" --tls-private-key-file="$certs/apiserver.key" \
    --service-namespace="$NAMESPACE" \
    --authentication-kubeconfig="$CLUSTER_DIR/migration-apiserver.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/migration-apiserver.kubeconfig" \
    --kubeconfig="$CLUSTER_DIR/migration-apiserver.kubeconfig" \
    --audit-policy-file="$root/manifests/audit/policy.yaml" \
    --audit-log-path="$CLUSTER_DIR/logs/migration-apiserver-audit.log" \
    ${runtime_config:+--runtime-config="$runtime_config"} \
    $SERVER_ARGS
  ready migration-apiserver
  # Every APIService the kit registered (the files it applied) is Available: the aggregator reaches us.
  local f
  for f in "$certs"/deploy/apiservice/*.yaml; do
    [ -f "$f" ] || continue
    wait_for 90 "$CLUSTER_DIR/logs/kube-apiserver.log" kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" \
      wait --for=condition=Available --timeout=2s "apiservice/$(basename "$f" .yaml)"
  done
}

up() {
  if [ -f "$CLUSTER_DIR/pids/kube-apiserver" ] && alive "$(cat "$CLUSTER_DIR/pids/kube-apiserver")"; then
    echo "a cluster already runs from $CLUSTER_DIR: make cluster-down first" >&2
    exit 1
  fi
  for bin in kube-apiserver kube-controller-manager kubectl etcd etcdctl; do
    [ -x "$KUBE_BIN_DIR/$bin" ] || { echo "missing $KUBE_BIN_DIR/$bin: run make kube" >&2; exit 1; }
  done
  [ "$SERVER" = off ] || [ -x "$MIGRATION_APISERVER" ] || { echo "missing $MIGRATION_APISERVER" >&2; exit 1; }
  case "$INTREE" in on | off) ;; *) echo "INTREE must be on or off, not $INTREE" >&2; exit 1 ;; esac
  case "$FORM" in aggregated | crds) ;; *) echo "FORM must be aggregated or crds, not $FORM" >&2; exit 1 ;; esac
  # A start that fails half-way stops what it started.
  trap 'status=$?; [ $status -eq 0 ] || down; exit $status' EXIT
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids"
  ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port) ETCD_METRICS_PORT=$(free_port)
  API_PORT=$(free_port) KCM_PORT=$(free_port) SERVER_PORT=$(free_port)
  cat > "$CLUSTER_DIR/cluster.env" <<EOF
ETCD_PORT=$ETCD_PORT
API_PORT=$API_PORT
KCM_PORT=$KCM_PORT
SERVER_PORT=$SERVER_PORT
INTREE=$INTREE
FORM=$FORM
EOF
  if [ -n "${CLUSTER_OWNER_PID:-}" ]; then
    # Whatever ends the owner (a test binary's exit, a panic), the cluster goes with it.
    # CLUSTER_REMOVE_DIR=1: the directory goes too (a test's temporary one).
    local remove=""
    [ "${CLUSTER_REMOVE_DIR:-}" = 1 ] && remove="; rm -rf '$CLUSTER_DIR'"
    setsid bash -c "tail --pid=$CLUSTER_OWNER_PID -f /dev/null; CLUSTER_DIR='$CLUSTER_DIR' bash '$0' down$remove" \
      > /dev/null 2>&1 < /dev/null &
    echo $! > "$CLUSTER_DIR/pids/owner-watch"
  fi
  pki_up
  encryption_config
  audit_policy
  admission_config
  kubeconfig "$CLUSTER_DIR/admin.kubeconfig" kubernetes-admin admin
  kubeconfig "$CLUSTER_DIR/nobody.kubeconfig" nobody nobody
  kubeconfig "$CLUSTER_DIR/kube-controller-manager.kubeconfig" system:kube-controller-manager kube-controller-manager
  etcd_up
  kube_apiserver_up
  kube_controller_manager_up
  [ "$SERVER" = off ] || server_up
  cat <<EOF
A local cluster runs (Kubernetes $(kube-apiserver --version | cut -d' ' -f2), storagemigration.k8s.io $INTREE,$([ "$SERVER" = off ] && echo " without migration-apiserver" || echo " migration-apiserver in the $FORM form")):
  export PATH=$KUBE_BIN_DIR:\$PATH
  kubectl --kubeconfig $CLUSTER_DIR/admin.kubeconfig get storagestates     # cluster admin
  kubectl --kubeconfig $CLUSTER_DIR/nobody.kubeconfig get storagestates    # a user with no rights (403)
Logs in $CLUSTER_DIR/logs. Stop it with: make cluster-down
EOF
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  stop) stop_one "${2:?stop NAME}" ;;
  restart) restart_one "${2:?restart NAME}" ;;
  *) echo "usage: $0 up|down|stop NAME|restart NAME" >&2; exit 2 ;;
esac
