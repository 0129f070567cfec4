//go:build tools

// Package tools pins the kubelet (k8s.io/kubernetes) for scripts/kubelet.sh, which builds it from
// this module. go.mod names the release and replaces every k8s.io staging module that
// k8s.io/kubernetes's own go.mod requires as v0.0.0 (and maps to ./staging/src/...) with its
// published version of the same release, v1.37.2 -> v0.37.2; go.sum holds the hash of every module
// it is built from. k8s.io/sample-cli-plugin and k8s.io/sample-controller, which that go.mod also
// maps but does not require, are left out: nothing needs them and the Go module proxy does not
// serve them.
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
