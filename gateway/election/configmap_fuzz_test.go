package election

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// FuzzParseConfigMap parses arbitrary election and sync records: what is
// accepted is the pool's record of the kind asked, in tether-system, with
// a resourceVersion when it is an update, and parses again to the same
// ConfigMap once encoded; what is refused is refused as a BadRecord. An
// accepted election record then becomes, for its sender, a record that
// names the sender or no one and no time after now.
func FuzzParseConfigMap(f *testing.F) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	election := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("p1"), Namespace: record.Namespace, ResourceVersion: "17"}}
	if err := record.SetElection(election, record.Election{HolderIdentity: "edge-1", LeaseDurationSeconds: 15,
		AcquireTime: metav1.NewTime(now.Add(-time.Minute)), RenewTime: metav1.NewTime(now.Add(time.Hour)), LeaderTransitions: 2}); err != nil {
		f.Fatal(err)
	}
	sync := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.SyncName("p1")},
		Data: map[string]string{"leader": "edge-1"}}
	for _, cm := range []*corev1.ConfigMap{election, sync} {
		b, err := json.Marshal(cm)
		if err != nil {
			f.Fatal(err)
		}
		for _, op := range []tunnel.ElectionOp{tunnel.ElectionCreate, tunnel.ElectionUpdate} {
			for _, rec := range []tunnel.RecordKind{tunnel.RecordElection, tunnel.RecordSync} {
				f.Add(byte(op), byte(rec), "p1", "edge-1", b)
			}
		}
	}
	f.Add(byte(tunnel.ElectionUpdate), byte(tunnel.RecordElection), "p1", "edge-1",
		[]byte(`{"metadata":{"name":"pool-p1","resourceVersion":"3","annotations":{"control-plane.alpha.kubernetes.io/leader":"{\"holderIdentity\":\"\"}"}}}`))
	f.Fuzz(func(t *testing.T, op, kind byte, pool, sender string, cm []byte) {
		req := tunnel.ElectionRequest{Op: tunnel.ElectionOp(op), Record: tunnel.RecordKind(kind), Pool: pool, ConfigMap: cm}
		got, err := parseConfigMap(req)
		if err != nil {
			var r *poolcheck.Refusal
			if !errors.As(err, &r) || r.Code != tunnel.BadRecord {
				t.Fatalf("refused with %v, not a BadRecord", err)
			}
			return
		}
		want := record.ElectionName(pool)
		if req.Record == tunnel.RecordSync {
			want = record.SyncName(pool)
		}
		if got.Name != want || got.Namespace != record.Namespace ||
			(req.Op == tunnel.ElectionUpdate && got.ResourceVersion == "") ||
			(got.Kind != "" && got.Kind != "ConfigMap") || (got.APIVersion != "" && got.APIVersion != "v1") {
			t.Fatalf("accepted %s/%s (%s %s, resourceVersion %q) as pool %q's %s record", got.Namespace, got.Name,
				got.APIVersion, got.Kind, got.ResourceVersion, pool, req.Record)
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("accepted ConfigMap does not encode: %v", err)
		}
		again, err := parseConfigMap(tunnel.ElectionRequest{Op: req.Op, Record: req.Record, Pool: pool, ConfigMap: b})
		if err != nil {
			t.Fatalf("accepted ConfigMap %s refused once encoded: %v", b, err)
		}
		if b2, _ := json.Marshal(again); !bytes.Equal(b, b2) {
			t.Fatalf("encoded and parsed again:\n%s\n%s", b, b2)
		}
		if req.Record != tunnel.RecordElection {
			return
		}
		out, err := (&Handler{}).electionRecord(sender, got, nil, now)
		if err != nil {
			var r *poolcheck.Refusal
			if !errors.As(err, &r) {
				t.Fatalf("election record refused with %v, not a refusal", err)
			}
			return
		}
		rec, err := record.DecodeElection(out)
		if err != nil {
			t.Fatalf("written election record does not decode: %v", err)
		}
		if rec.HolderIdentity != sender || rec.RenewTime.After(now) || rec.AcquireTime.After(now) ||
			out.Name != want || out.Namespace != record.Namespace {
			t.Fatalf("a new record %s/%s from %q: %+v (now %v)", out.Namespace, out.Name, sender, rec, now)
		}
	})
}
