package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

func TestLevelsAndFormats(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewTo(&buf, "warn", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "node", "edge-1")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("want exactly one JSON record, got %q: %v", buf.String(), err)
	}
	if rec["msg"] != "shown" || rec["node"] != "edge-1" {
		t.Errorf("record = %v", rec)
	}
	for _, bad := range [][2]string{{"loud", "text"}, {"info", "xml"}} {
		if _, err := NewTo(&buf, bad[0], bad[1]); err == nil {
			t.Errorf("NewTo(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestKlogIsRouted(t *testing.T) {
	var buf bytes.Buffer
	if _, err := NewTo(&buf, "info", "text"); err != nil {
		t.Fatal(err)
	}
	klog.InfoS("from client-go", "resource", "nodes")
	klog.Flush()
	if out := buf.String(); !strings.Contains(out, "from client-go") || !strings.Contains(out, "source=client-go") {
		t.Errorf("klog output not routed into slog: %q", out)
	}
}
