#!/usr/bin/env bash
# `make deploy`: installs migration-apiserver into the cluster of the current kubectl context, without cert-manager.
#
# The serving certificate and its CA come from $CERT_DIR (`make certs`: SANs migration-apiserver.<ns>.svc). A
# kustomize overlay generated in $CERT_DIR/deploy adds to manifests/:
#   - the Secret migration-apiserver-serving (tls.crt, tls.key) that the Deployment mounts;
#   - manifests/roles/: ClusterRoles that add our kinds to the built-in view, edit and admin roles;
#   - FORM=aggregated (default): the APIServices of apiservice/ that `migration-apiserver deploy-check` chooses for
#     this cluster, with spec.caBundle = base64($CERT_DIR/ca.crt). It asks the cluster (/version, APIServices,
#     CRDs) and registers a group of ours only where the group is absent or already ours; it skips, saying why, a
#     group the cluster serves itself (storagemigration.k8s.io from 1.37, or turned on with --runtime-config),
#     one another server's APIService registers (gardener-apiserver's core.gardener.cloud), and one that CRDs serve
#     (kube-storage-version-migrator's migration.k8s.io). IN_TREE_GROUPS=register|skip overrides the decision for
#     storagemigration.k8s.io (default auto); OFFLINE=1 renders without asking a cluster (then IN_TREE_GROUPS must
#     be register or skip, and nothing is guarded);
#     FORM=crds: the CRDs and webhook configurations `migration-apiserver deploy-check --form crds` writes for this
#     cluster (those of manifests/crds/ and manifests/webhooks/, without a group that is not ours to serve, decided
#     as for the APIServices), with clientConfig.caBundle filled the same way, the CSI webhooks of
#     manifests/webhooks/, and manifests/webhook-caller/ (RBAC for kube-apiserver's webhook client);
#   - for a group another server serves: the Deployment's `serve --runtime-config=<group>/<version>=false,...`, so
#     that the server runs beside that server without the group;
#   - IMAGE=<ref>: the container image (default: migration-apiserver:dev as in manifests/deployment.yaml);
#   - LOCAL_PORT=<port>: the server runs outside the cluster, as a process on the machine of kube-apiserver listening
#     on localhost:<port> (`make cluster`, docs/install/local-cluster.md): no Deployment, PVC or PDB; the Service is
#     an ExternalName of localhost, which the aggregator and the webhook client resolve to https://localhost:<port>
#     (an ExternalName has no ports of its own: the APIServices and webhook configurations name <port>); the TLS
#     name they check stays migration-apiserver.migration-apiserver.svc.
# The manifests that name our kinds (CRDs, roles, APIServices, webhook configurations, our kinds' RBAC) are generated
# by `make manifests`; this script only composes them. DRY_RUN=1 prints the rendered objects instead of applying them.
# MIGRATION_APISERVER: the binary (`make deploy` passes its release build).
set -euo pipefail

CERT_DIR=${CERT_DIR:-./certs}
FORM=${FORM:-aggregated}
IMAGE=${IMAGE:-}
LOCAL_PORT=${LOCAL_PORT:-}
DRY_RUN=${DRY_RUN:-}
IN_TREE_GROUPS=${IN_TREE_GROUPS:-auto}
OFFLINE=${OFFLINE:-}
root=$(cd "$(dirname "$0")/.." && pwd)
MIGRATION_APISERVER=${MIGRATION_APISERVER:-$root/target/release/migration-apiserver}

for f in ca.crt apiserver.crt apiserver.key; do
  [ -f "$CERT_DIR/$f" ] || { echo "missing $CERT_DIR/$f: run make certs" >&2; exit 1; }
done
case "$FORM" in
  aggregated | crds) ;;
  *) echo "FORM must be aggregated or crds, not $FORM" >&2; exit 1 ;;
esac
if [ -n "$LOCAL_PORT" ] && ! [[ "$LOCAL_PORT" =~ ^[1-9][0-9]{0,4}$ && "$LOCAL_PORT" -le 65535 ]]; then
  echo "LOCAL_PORT must be a port number, not $LOCAL_PORT" >&2
  exit 1
fi

overlay="$CERT_DIR/deploy"
rm -rf "$overlay"
mkdir -p "$overlay"
cp "$CERT_DIR/apiserver.crt" "$overlay/tls.crt"
cp "$CERT_DIR/apiserver.key" "$overlay/tls.key"
chmod 600 "$overlay/tls.key"
ca_bundle=$(base64 < "$CERT_DIR/ca.crt" | tr -d '\n')
rel=$(realpath --relative-to="$overlay" "$root")

check=(deploy-check --in-tree-groups "$IN_TREE_GROUPS" --runtime-config-out "$overlay/runtime-config")
if [ -n "$OFFLINE" ]; then check+=(--offline); fi

# The APIServices for this cluster: copied into the overlay (kustomize loads files only from below its root).
apiservices=()
if [ "$FORM" = aggregated ]; then
  names=$("$MIGRATION_APISERVER" "${check[@]}")
  mkdir -p "$overlay/apiservice"
  for name in $names; do
    cp "$root/apiservice/$name.yaml" "$overlay/apiservice/"
    apiservices+=("apiservice/$name.yaml")
  done
else
  # crds/ and webhooks/ (the two generated configurations); the CSI webhooks and the kustomization listing them
  # all come from manifests/webhooks/.
  "$MIGRATION_APISERVER" "${check[@]}" --form crds --output-dir "$overlay" > /dev/null
  cp "$root"/manifests/webhooks/csi-migration-*.yaml "$root/manifests/webhooks/kustomization.yaml" "$overlay/webhooks/"
fi
# A local server: the Service's port (443) becomes the local one wherever our Service is named, in the copies above.
if [ -n "$LOCAL_PORT" ]; then
  for f in "$overlay"/apiservice/*.yaml "$overlay"/webhooks/*.yaml; do
    [ -f "$f" ] && sed -i -E "s/^( *)port: 443\$/\1port: $LOCAL_PORT/" "$f"
  done
fi

{
  echo "# Generated by scripts/deploy.sh; do not edit."
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  echo "  - $rel/manifests"
  echo "  - $rel/manifests/roles"
  if [ "$FORM" = aggregated ]; then
    for a in "${apiservices[@]}"; do echo "  - $a"; done
  else
    echo "  - crds"
    echo "  - webhooks"
    echo "  - $rel/manifests/webhook-caller"
  fi
  echo "secretGenerator:"
  echo "  - name: migration-apiserver-serving"
  echo "    namespace: migration-apiserver"
  echo "    type: kubernetes.io/tls"
  echo "    files: [tls.crt, tls.key]"
  echo "    options: {disableNameSuffixHash: true}"
  # caBundle from a local-only ConfigMap (kustomize drops it from the output) into every APIService, or into every
  # webhook of every webhook configuration.
  echo "configMapGenerator:"
  echo "  - name: migration-apiserver-ca-bundle"
  echo "    literals: [caBundle=$ca_bundle]"
  echo "    options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: \"true\"}}"
  echo "replacements:"
  echo "  - source: {kind: ConfigMap, name: migration-apiserver-ca-bundle, fieldPath: data.caBundle}"
  echo "    targets:"
  if [ "$FORM" = aggregated ]; then
    echo "      - select: {kind: APIService}"
    echo "        fieldPaths: [spec.caBundle]"
    echo "        options: {create: true}"
  else
    for kind in MutatingWebhookConfiguration ValidatingWebhookConfiguration; do
      echo "      - select: {kind: $kind}"
      echo "        fieldPaths: [webhooks.*.clientConfig.caBundle]"
      echo "        options: {create: true}"
    done
  fi
  # Groups another server serves: the server leaves them alone (deploy-check said which, and why, on stderr).
  runtime_config=$(cat "$overlay/runtime-config")
  if [ -n "$runtime_config" ] || [ -n "$LOCAL_PORT" ]; then echo "patches:"; fi
  if [ -n "$runtime_config" ] && [ -z "$LOCAL_PORT" ]; then
    echo "  - target: {kind: Deployment, name: migration-apiserver}"
    echo "    patch: |-"
    echo "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: '--runtime-config=$runtime_config'}"
  fi
  if [ -n "$LOCAL_PORT" ]; then
    echo "  - target: {kind: Service, name: migration-apiserver}"
    echo "    patch: |-"
    echo "      - {op: replace, path: /spec, value: {type: ExternalName, externalName: localhost}}"
    for obj in "apps/v1 Deployment" "v1 PersistentVolumeClaim migration-apiserver-data" "policy/v1 PodDisruptionBudget"; do
      read -r api kind name <<< "$obj"
      echo "  - patch: |-"
      echo "      \$patch: delete"
      echo "      apiVersion: $api"
      echo "      kind: $kind"
      echo "      metadata: {name: ${name:-migration-apiserver}, namespace: migration-apiserver}"
    done
  fi
  if [ -n "$IMAGE" ]; then
    name=${IMAGE%:*}
    tag=${IMAGE##*:}
    if [ "$name" = "$IMAGE" ] || [[ "$tag" == */* ]]; then name=$IMAGE; tag=latest; fi
    echo "images:"
    echo "  - {name: migration-apiserver, newName: $name, newTag: $tag}"
  fi
} > "$overlay/kustomization.yaml"

if [ -n "$DRY_RUN" ]; then
  kubectl kustomize "$overlay"
else
  kubectl apply -k "$overlay"
  if [ -n "$LOCAL_PORT" ]; then
    echo "deployed ($FORM form) for a server on localhost:$LOCAL_PORT"
  else
    echo "deployed ($FORM form); kubectl -n migration-apiserver rollout status deployment/migration-apiserver"
  fi
fi
