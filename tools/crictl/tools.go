//go:build tools

// Package tools pins crictl and critest (cri-tools) for scripts/crictl.sh, which builds them from
// this module: go.mod names the version, go.sum the hash of every module they are built from.
// critest is the test binary of cmd/critest (built with `go test -c`), so the packages its test
// file imports are listed too: without them go.sum would lack their modules.
package tools

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
