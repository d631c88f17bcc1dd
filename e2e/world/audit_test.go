package world

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReadAudit(t *testing.T) {
	// A node's get, its watch (logged when it starts and when it ends), a
	// non-resource URL, another user's request, one before the window and
	// a half-written last line.
	log := `{"kind":"Event","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/nodes/edge-1","verb":"get","user":{"username":"system:node:edge-1"},"userAgent":"hollow-kubelet/v1.36.3 (linux/amd64)","objectRef":{"resource":"nodes","name":"edge-1"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-29T01:00:01.000000Z"}
{"kind":"Event","auditID":"a2","stage":"ResponseStarted","requestURI":"/api/v1/pods?watch=true","verb":"watch","user":{"username":"system:node:edge-1"},"userAgent":"kubelet/v1.36.3","objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-29T01:00:02.000000Z"}
{"kind":"Event","auditID":"a3","stage":"ResponseComplete","requestURI":"/readyz?timeout=5s","verb":"get","user":{"username":"system:node:edge-1"},"userAgent":"tether-edge/dev","responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-29T01:00:03.000000Z"}
{"kind":"Event","auditID":"a4","stage":"ResponseComplete","requestURI":"/api/v1/nodes/edge-10/status","verb":"patch","user":{"username":"system:node:edge-10"},"userAgent":"kubelet/v1.36.3","objectRef":{"resource":"nodes","subresource":"status"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-29T01:00:03.000000Z"}
{"kind":"Event","auditID":"a0","stage":"ResponseComplete","requestURI":"/api/v1/nodes","verb":"create","user":{"username":"system:node:edge-1"},"userAgent":"kubelet/v1.36.3","objectRef":{"resource":"nodes"},"responseStatus":{"code":201},"requestReceivedTimestamp":"2026-11-29T00:59:59.000000Z"}
{"kind":"Event","auditID":"a2","stage":"ResponseComplete","requestURI":"/api/v1/pods?watch=true","verb":"watch","user":{"username":"system:node:edge-1"},"userAgent":"kubelet/v1.36.3","objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-29T01:00:02.000000Z"}
{"kind":"Event","auditID":"a5","stage":"Resp`
	from := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	got, err := readAudit(strings.NewReader(log), NodeUser("edge-1"), from, from.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	at := func(s int) time.Time { return from.Add(time.Duration(s) * time.Second) }
	want := []AuditRequest{
		{ID: "a1", User: "system:node:edge-1", Verb: "get", Resource: "nodes", Agent: "hollow-kubelet", Code: 200, Received: at(1)},
		{ID: "a2", User: "system:node:edge-1", Verb: "watch", Resource: "pods", Agent: "kubelet", Code: 200, Received: at(2)},
		{ID: "a3", User: "system:node:edge-1", Verb: "get", Resource: "/readyz", Agent: "tether-edge", Code: 200, Received: at(3)},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("requests (-want +got):\n%s", d)
	}
	all, err := readAudit(strings.NewReader(log), "", from, from.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || all[3].Kind() != "patch nodes/status" {
		t.Errorf("every user's requests: %+v", all)
	}
}
