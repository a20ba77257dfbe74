# migration-apiserver. `make run` starts the server on the embedded store; `make test` runs every test.
CARGO ?= cargo
PORT ?= 8443
DATA_DIR ?= ./data
CERT_DIR ?= ./certs
# cargo's output directory: CARGO_TARGET_DIR when it is set, as for cargo itself.
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
BIN := $(TARGET_DIR)/release/migration-apiserver
# The Python `kubernetes` client for the tests lives in this venv (see scripts/install-test-deps.sh).
PYTHON_VENV ?= $(TARGET_DIR)/pyenv
# make deploy: FORM=aggregated (APIServices, default) or crds (CRDs + admission webhooks); IMAGE=<registry>/<name>:<tag>
FORM ?= aggregated
# make deploy: our APIServices of groups the cluster may serve itself (storagemigration.k8s.io): auto (ask the
# cluster: /version and its APIServices), register or skip.
IN_TREE_GROUPS ?= auto
# make deploy OFFLINE=1: render without asking the cluster (IN_TREE_GROUPS=register or skip; nothing is guarded).
OFFLINE ?=
# make run ARGS='--storage-version shootstates.core.gardener.cloud=v1alpha1': further serve flags.
ARGS ?=
IMAGE ?=

# make kube: the real cluster's release (kube-apiserver, kube-controller-manager, kubectl from tools/kube; etcd and
# etcdctl from tools/etcd), built from their Go modules.
KUBE_VERSION ?= v1.37.2
KUBE_BIN_DIR ?= $(TARGET_DIR)/kube/$(KUBE_VERSION)
# make cluster: where the local cluster keeps its certificates, data and logs; INTREE=off starts kube-apiserver
# without storagemigration.k8s.io (FORM, above, chooses the form this server is registered in).
CLUSTER_DIR ?= $(TARGET_DIR)/cluster
INTREE ?= on

.PHONY: build build-deps run test deps kube cluster cluster-down bench certs manifests docs deploy image lint fmt clean

# protoc, which etcd-client's build needs (installed from Debian's packages when missing).
build-deps:
	bash scripts/install-test-deps.sh --build-only

build: build-deps
	$(CARGO) build --release --bin migration-apiserver

run: build
	$(BIN) serve --secure-port $(PORT) --data-dir $(DATA_DIR) --cert-dir $(CERT_DIR) $(ARGS)

# Installs what the tests need when it is missing (protoc, kubectl, etcd, prometheus), then runs unit and integration tests on
# the embedded store, and the API conformance and durability suites again on etcd.
deps:
	PYTHON_VENV=$(PYTHON_VENV) bash scripts/install-test-deps.sh

test: export MIGRATION_APISERVER_TEST_PYTHON = $(abspath $(PYTHON_VENV))/bin/python
test: export KUBE_BIN_DIR := $(abspath $(KUBE_BIN_DIR))
test: deps kube
	$(CARGO) build --bin migration-apiserver
	$(CARGO) test --workspace --all-targets --no-fail-fast
	MIGRATION_APISERVER_TEST_BACKEND=etcd $(CARGO) test --test api --test kubectl --test durability --no-fail-fast

# Builds the real cluster's binaries into $(KUBE_BIN_DIR) (needs Go 1.26+ and the Go module proxy); reuses them when
# they are newer than tools/kube and tools/etcd.
kube:
	KUBE_VERSION=$(KUBE_VERSION) KUBE_BIN_DIR=$(abspath $(KUBE_BIN_DIR)) bash scripts/build-kube.sh

# A real local cluster (etcd, kube-apiserver, kube-controller-manager of $(KUBE_VERSION)) with this server in it,
# registered by the deploy kit as a local process (docs/install/local-cluster.md). Prints the kubeconfigs.
cluster: build build-deps kube
	CLUSTER_DIR=$(abspath $(CLUSTER_DIR)) KUBE_BIN_DIR=$(abspath $(KUBE_BIN_DIR)) MIGRATION_APISERVER=$(abspath $(BIN)) \
		INTREE=$(INTREE) FORM=$(FORM) SERVER_ARGS='$(ARGS)' bash scripts/cluster.sh up

cluster-down:
	CLUSTER_DIR=$(abspath $(CLUSTER_DIR)) bash scripts/cluster.sh down

bench: deps
	$(CARGO) build --release --workspace --bins
	$(TARGET_DIR)/release/bench --server $(BIN)

# CA, serving certificate (SANs include migration-apiserver.migration-apiserver.svc, the in-cluster name) and admin
# client certificate; existing files are kept.
certs: build
	$(BIN) certs --cert-dir $(CERT_DIR) --service-namespace migration-apiserver

# Regenerates the manifests generated from the kinds: CRDs, roles, APIServices, the webhook configurations for our
# kinds and the migrator's RBAC for them (tests/admission.rs fails when the committed ones differ).
manifests: build
	$(BIN) manifests --output-dir .

# Rewrites the generated `--help` blocks of docs/reference/flags.md from the binary (tests/docs.rs fails when they
# differ). The debug build: the help is the same, and the tests build it anyway.
docs: build-deps
	$(CARGO) build --bin migration-apiserver
	bash scripts/docs.sh $(TARGET_DIR)/debug/migration-apiserver

# The container image (manifests/image/Dockerfile; needs a Docker engine): make image IMAGE=<registry>/<name>:<tag>
image:
	docker build -f manifests/image/Dockerfile -t $(or $(IMAGE),migration-apiserver:dev) .

# Installs into the cluster of the current kubectl context, without cert-manager: the serving certificate of
# $(CERT_DIR) as Secret, manifests/, and apiservice/ with caBundle = $(CERT_DIR)/ca.crt (see scripts/deploy.sh); a
# group of ours that the cluster, another server or other CRDs already serve is skipped, with the reason
# (`migration-apiserver deploy-check`).
deploy: certs
	CERT_DIR=$(CERT_DIR) FORM=$(FORM) IMAGE=$(IMAGE) IN_TREE_GROUPS=$(IN_TREE_GROUPS) OFFLINE=$(OFFLINE) MIGRATION_APISERVER=$(BIN) \
		bash scripts/deploy.sh

lint: build-deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf $(DATA_DIR) target
