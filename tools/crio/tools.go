//go:build tools

// Package tools pins CRI-O for scripts/runtimes.sh (`build crio`), which builds cmd/crio from
// this module: go.mod names the version, go.sum the hash of every module it is built from.
package tools

import _ "github.com/cri-o/cri-o/cmd/crio"
