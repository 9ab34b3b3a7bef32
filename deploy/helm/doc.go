// Package helm holds no code: the directory has the Helm chart
// (outbox-cdc/), and its test renders the chart with the Helm SDK and checks
// the manifests against the Kubernetes and prometheus-operator API types, the
// connector's configuration and the metrics the binary exports.
package helm
