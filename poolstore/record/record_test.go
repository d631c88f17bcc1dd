package record_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/poolstore/record"
)

// The narrow client's ConfigMaps read and write the records, as the
// clientset's do.
var (
	_ record.ConfigMapGetter = (*kube.ConfigMaps)(nil)
	_ record.ConfigMapWriter = (*kube.ConfigMaps)(nil)
)

// configMaps is a ConfigMapGetter over a map of ConfigMaps by name.
type configMaps map[string]*corev1.ConfigMap

func (m configMaps) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.ConfigMap, error) {
	if cm, ok := m[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// TestReadLeader reads a record as client-go's leader election writes
// it, strategy and preferredHolder included.
func TestReadLeader(t *testing.T) {
	ctx := context.Background()
	cms := configMaps{}
	if _, err := record.ReadLeader(ctx, cms, "p1"); !apierrors.IsNotFound(err) {
		t.Fatalf("no record: %v; want not found", err)
	}
	raw := `{"holderIdentity":"b","leaseDurationSeconds":15,"acquireTime":"2025-06-01T11:00:00Z","renewTime":"2025-06-01T12:00:00Z","leaderTransitions":4,"strategy":"","preferredHolder":""}`
	cms["pool-p1"] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-p1", Namespace: "tether-system",
		Annotations: map[string]string{"control-plane.alpha.kubernetes.io/leader": raw}}}
	got, err := record.ReadLeader(ctx, cms, "p1")
	if err != nil {
		t.Fatal(err)
	}
	want := record.Leader{Holder: "b", Renewed: t0, LeaseSeconds: 15}
	if !got.Renewed.Equal(want.Renewed) || got.LeaseSeconds != want.LeaseSeconds || got.Holder != want.Holder ||
		!got.Expires(record.DefaultLeaseDuration).Equal(t0.Add(15*time.Second)) {
		t.Fatalf("ReadLeader = %+v; want %+v", got, want)
	}

	released := cms["pool-p1"].DeepCopy()
	if err := record.SetElection(released, record.Election{LeaseDurationSeconds: 1, RenewTime: metav1.NewTime(t0), LeaderTransitions: 4}); err != nil {
		t.Fatal(err)
	}
	cms["pool-p1"] = released
	if _, err := record.ReadLeader(ctx, cms, "p1"); !apierrors.IsNotFound(err) {
		t.Fatalf("released record: %v; want not found", err)
	}

	cms["pool-p1"].Annotations[record.ElectionAnnotation] = "{"
	if _, err := record.ReadLeader(ctx, cms, "p1"); err == nil || apierrors.IsNotFound(err) {
		t.Fatalf("damaged record: %v; want a decoding error", err)
	}
}

// TestReadLeaderClamps: a record's leaseDurationSeconds, which its holder
// writes, counts for at most the reader's own lease duration, and no value
// overflows a time.Duration.
func TestReadLeaderClamps(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		secs int
		max  time.Duration
		want time.Duration
	}{
		{15, 15 * time.Second, 15 * time.Second},
		{10, 15 * time.Second, 10 * time.Second},
		{1, 15 * time.Second, time.Second},
		{0, 15 * time.Second, 0},
		{-5, 15 * time.Second, 0},
		{16, 15 * time.Second, 15 * time.Second},
		{3000000000, 15 * time.Second, 15 * time.Second},
		{math.MaxInt, 15 * time.Second, 15 * time.Second},
		{math.MaxInt, 1500 * time.Millisecond, 1500 * time.Millisecond},
		{15, 0, 0},
	} {
		if got := (record.Election{LeaseDurationSeconds: c.secs}).Lease(c.max); got != c.want {
			t.Errorf("Election{LeaseDurationSeconds: %d}.Lease(%v) = %v; want %v", c.secs, c.max, got, c.want)
		}
		raw := fmt.Sprintf(`{"holderIdentity":"thief","leaseDurationSeconds":%d,"renewTime":"2025-06-01T12:00:00Z"}`, c.secs)
		cms := configMaps{"pool-p1": &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-p1", Namespace: "tether-system",
			Annotations: map[string]string{record.ElectionAnnotation: raw}}}}
		el, err := record.ReadLeader(ctx, cms, "p1")
		if err != nil {
			t.Fatal(err)
		}
		if got := el.Expires(c.max); !got.Equal(t0.Add(c.want)) {
			t.Errorf("leaseDurationSeconds %d read with a %v lease expires at %v; want %v", c.secs, c.max, got, t0.Add(c.want))
		}
	}
}

// TestElectionRoundTrip: a record set on a ConfigMap decodes as it was,
// and a ConfigMap without the annotation holds an empty one.
func TestElectionRoundTrip(t *testing.T) {
	empty, err := record.DecodeElection(&corev1.ConfigMap{})
	if err != nil || empty != (record.Election{}) {
		t.Fatalf("DecodeElection(no annotation) = %+v, %v; want empty", empty, err)
	}
	rec := record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: metav1.NewTime(t0),
		RenewTime: metav1.NewTime(t0.Add(4 * time.Second)), LeaderTransitions: 2}
	cm := &corev1.ConfigMap{}
	if err := record.SetElection(cm, rec); err != nil {
		t.Fatal(err)
	}
	got, err := record.DecodeElection(cm)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rec, got); diff != "" {
		t.Errorf("round trip (-set +decoded):\n%s", diff)
	}
}

// TestSync: the sync record's data keys and format, and a record missing
// a key or with a bad value is refused.
func TestSync(t *testing.T) {
	rec := record.Sync{HolderIdentity: "a", RenewTime: t0.Add(1500 * time.Millisecond), LeaseDurationSeconds: 30}
	data := rec.Data()
	want := map[string]string{"holderIdentity": "a", "renewTime": "2025-06-01T12:00:01.5Z", "leaseDurationSeconds": "30"}
	if diff := cmp.Diff(want, data); diff != "" {
		t.Errorf("Data (-want +got):\n%s", diff)
	}
	got, err := record.DecodeSync(&corev1.ConfigMap{Data: data})
	if err != nil || got != rec {
		t.Errorf("DecodeSync = %+v, %v; want %+v", got, err, rec)
	}
	for _, bad := range []map[string]string{
		{"holderIdentity": "a", "renewTime": "2025-06-01T12:00:01.5Z"},
		{"holderIdentity": "a", "renewTime": "yesterday", "leaseDurationSeconds": "30"},
		{"holderIdentity": "a", "renewTime": "2025-06-01T12:00:01.5Z", "leaseDurationSeconds": "thirty"},
	} {
		if _, err := record.DecodeSync(&corev1.ConfigMap{Data: bad}); err == nil {
			t.Errorf("DecodeSync(%v) succeeded; want an error", bad)
		}
	}
}

// TestNames: the records' names are part of the contract with
// operators (packaging/kubernetes/pool-rbac.yaml, tetherctl pools).
func TestNames(t *testing.T) {
	if record.Namespace != "tether-system" || record.ElectionName("shop") != "pool-shop" || record.SyncName("shop") != "pool-shop-sync" {
		t.Errorf("names: %s, %s, %s", record.Namespace, record.ElectionName("shop"), record.SyncName("shop"))
	}
}
