//go:build tools

// Package tools pins crictl (cri-tools) for scripts/crictl.sh, which builds it from this module:
// go.mod names the version, go.sum the hash of every module it is built from.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
