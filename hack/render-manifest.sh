#!/usr/bin/env bash
# Writes manifests/kubenet.yaml from the Helm chart in manifests/chart with its default values: the
# chart is the one source, the plain manifest its rendering; and the chart's values.schema.json from
# the config-key table (hack/support/chart-schema.ts). test/manifests/chart.test.ts checks both files are
# exactly what this writes. Helm is the pinned build of hack/build-upstream.sh.
#
#   bash hack/render-manifest.sh           rewrite manifests/kubenet.yaml
#   bash hack/render-manifest.sh --stdout  print it instead
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/build-upstream.sh helm >/dev/null
HELM=native/build/upstream/helm/helm
render() {
  cat <<'HEADER'
# kubenet-ts node agent for a real cluster: RBAC, config and the DaemonSet.
#   kubectl apply -f manifests/kubenet.yaml
# Generated from the Helm chart manifests/chart with its default values (bash hack/render-manifest.sh):
# change the chart, not this file; `helm install kubenet manifests/chart -n kube-system` installs the
# same objects, and its values (values.yaml, values.schema.json) change what is set here.
# Needs nodes with spec.podCIDR(s) set (kube-controller-manager --allocate-node-cidrs) and a
# container runtime whose CNI dirs are /opt/cni/bin and /etc/cni/net.d.
# The image is the one hack/build-image.sh builds (kubenet-ts:<package version>: the `kubenet`
# command, the native CNI forwarder, spawner and IPAM shim, the pinned reference CNI plugins in
# /usr/lib/cni). Import it on every node (`ctr -n k8s.io images import`) or push it to your registry
# and set the chart's image.repository (docs/cluster.md: "The image").
HEADER
  "$HELM" template kubenet manifests/chart --namespace kube-system
}
if [ "${1:-}" = --stdout ]; then render; exit 0; fi
npx tsx hack/support/chart-schema.ts >manifests/chart/values.schema.json.partial
mv -f manifests/chart/values.schema.json.partial manifests/chart/values.schema.json
out="$(render)"
printf '%s\n' "$out" >manifests/kubenet.yaml.partial
mv -f manifests/kubenet.yaml.partial manifests/kubenet.yaml
