package main

import (
	"strings"
	"testing"
)

// `tetherctl node` checks its arguments before it reads a kubeconfig.
func TestNodeUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node"}, "want `tetherctl node retire NAME`"},
		{[]string{"node", "retire"}, "want `tetherctl node retire NAME`"},
		{[]string{"node", "retire", "a", "b"}, "want `tetherctl node retire NAME`"},
		{[]string{"node", "retired", "a"}, "want `tetherctl node retire NAME`"},
		{[]string{"node", "forget", "a"}, "want `tetherctl node retire NAME`"},
		{[]string{"node", "retire", "Edge_1"}, `"Edge_1" is not a node name`},
		{[]string{"node", "retire", "edge-1", "--edge", "127.0.0.1"}, "--edge are for tetherctl pools"},
		{[]string{"status", "edge-1"}, `tetherctl status: unexpected arguments ["edge-1"]`},
		{[]string{"status", "--kubeconfig", "x"}, "--kubeconfig and --context for tetherctl pools and tetherctl node"},
	} {
		code, _, errOut := runCtl(tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("tetherctl %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errOut, exitUsage, tc.want)
		}
	}
}
