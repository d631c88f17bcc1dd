package elect

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
)

// memConfigMaps is the ConfigMaps of record.Namespace in memory, with the
// apiserver's resourceVersion checks; while down, every call fails.
type memConfigMaps struct {
	mu   sync.Mutex
	cms  map[string]*corev1.ConfigMap
	rv   int
	down bool
}

var (
	_ record.ConfigMapGetter = (*memConfigMaps)(nil)
	_ record.ConfigMapWriter = (*memConfigMaps)(nil)
)

var configMapsResource = corev1.Resource("configmaps")

func (m *memConfigMaps) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.ConfigMap, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	cm, ok := m.cms[name]
	if !ok {
		return nil, apierrors.NewNotFound(configMapsResource, name)
	}
	return cm.DeepCopy(), nil
}

func (m *memConfigMaps) Create(_ context.Context, cm *corev1.ConfigMap, _ metav1.CreateOptions) (*corev1.ConfigMap, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	if _, ok := m.cms[cm.Name]; ok {
		return nil, apierrors.NewAlreadyExists(configMapsResource, cm.Name)
	}
	return m.store(cm), nil
}

func (m *memConfigMaps) Update(_ context.Context, cm *corev1.ConfigMap, _ metav1.UpdateOptions) (*corev1.ConfigMap, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	old, ok := m.cms[cm.Name]
	if !ok {
		return nil, apierrors.NewNotFound(configMapsResource, cm.Name)
	}
	if cm.ResourceVersion != old.ResourceVersion {
		return nil, apierrors.NewConflict(configMapsResource, cm.Name, nil)
	}
	return m.store(cm), nil
}

func (m *memConfigMaps) store(cm *corev1.ConfigMap) *corev1.ConfigMap {
	if m.cms == nil {
		m.cms = map[string]*corev1.ConfigMap{}
	}
	m.rv++
	cm = cm.DeepCopy()
	cm.ResourceVersion = strconv.Itoa(m.rv)
	m.cms[cm.Name] = cm
	return cm.DeepCopy()
}

func (m *memConfigMaps) setDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

// put writes pool p1's record as another node would.
func (m *memConfigMaps) put(t *testing.T, rec record.Election) {
	t.Helper()
	raw, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.store(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("p1"), Namespace: record.Namespace,
		Annotations: map[string]string{record.ElectionAnnotation: string(raw)}}})
}

// record is pool p1's record.
func (m *memConfigMaps) record(t *testing.T) record.Election {
	t.Helper()
	m.mu.Lock()
	cm, ok := m.cms[record.ElectionName("p1")]
	m.mu.Unlock()
	if !ok {
		t.Fatal("no election record")
	}
	rec, err := record.DecodeElection(cm)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// t0 is the fake clock's start, a whole second as the record's times are.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// fakeElection is an Elector for node in pool p1 on cms, driven by a fake
// clock, with the default timings (15 s, 10 s, 2 s).
type fakeElection struct {
	t      *testing.T
	e      *Elector
	clk    *testclock.FakeClock
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	terms    int
	termOver bool   // the last term's context has ended
	holderAt string // the record's holder when the last term's context ended
}

func startFake(t *testing.T, cms *memConfigMaps, node string) *fakeElection {
	t.Helper()
	return startFakeWith(t, cms, Options{Pool: "p1", Node: node}, record.ClientWriter{ConfigMaps: cms})
}

// startFakeWith is startFake with options o, writing the record with w.
func startFakeWith(t *testing.T, cms *memConfigMaps, o Options, w record.Writer) *fakeElection {
	t.Helper()
	clk := testclock.NewFakeClock(t0)
	e, err := newElector(o, cms, w, clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeElection{t: t, e: e, clk: clk, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		e.Run(ctx, func(ctx context.Context) {
			f.mu.Lock()
			f.terms++
			f.termOver = false
			f.mu.Unlock()
			<-ctx.Done()
			holder := cms.record(t).HolderIdentity
			f.mu.Lock()
			f.termOver, f.holderAt = true, holder
			f.mu.Unlock()
		})
	}()
	t.Cleanup(func() { f.stop() })
	f.settle()
	return f
}

// settle waits until the elector sleeps on the clock again (or Run has
// returned).
func (f *fakeElection) settle() {
	f.t.Helper()
	testenv.Eventually(f.t, "the elector waits on its clock", func() bool {
		select {
		case <-f.done:
			return true
		default:
			return f.clk.HasWaiters()
		}
	})
}

// step advances the clock by d and lets the elector act on it.
func (f *fakeElection) step(d time.Duration) {
	f.t.Helper()
	f.clk.Step(d)
	f.settle()
}

func (f *fakeElection) stop() {
	f.cancel()
	<-f.done
}

// maxRetry is the longest wait between a candidate's tries: a step of it
// makes exactly one try.
const maxRetry = 2*time.Second + 2400*time.Millisecond

func (f *fakeElection) wantLeader(leader string, leading bool) {
	f.t.Helper()
	if l, ok := f.e.Leader(); l != leader || ok != leading {
		f.t.Fatalf("at +%v: Leader() = %q, %v; want %q, %v", f.clk.Since(t0), l, ok, leader, leading)
	}
}

func wantRecord(t *testing.T, cms *memConfigMaps, want record.Election) {
	t.Helper()
	if diff := cmp.Diff(want, cms.record(t)); diff != "" {
		t.Fatalf("election record (-want +got):\n%s", diff)
	}
}

func at(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d).Truncate(time.Second)) }

func TestElectorTakesFreeRecord(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		cms := &memConfigMaps{}
		f := startFake(t, cms, "a")
		f.wantLeader("a", true)
		wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(0)})
	})
	t.Run("released", func(t *testing.T) {
		cms := &memConfigMaps{}
		cms.put(t, record.Election{LeaseDurationSeconds: 1, AcquireTime: at(0), RenewTime: at(0), LeaderTransitions: 3})
		f := startFake(t, cms, "a")
		f.wantLeader("a", true)
		wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(0),
			LeaderTransitions: 4})
	})
}

// TestElectorWaitsForHolder: a record held by another node is taken only
// once it has not changed for its lease duration by the candidate's
// clock, whatever its renewTime says.
func TestElectorWaitsForHolder(t *testing.T) {
	cms := &memConfigMaps{}
	// b's clock is an hour behind: its renewTime looks long expired.
	old := metav1.NewTime(t0.Add(-time.Hour))
	cms.put(t, record.Election{HolderIdentity: "b", LeaseDurationSeconds: 15, AcquireTime: old, RenewTime: old, LeaderTransitions: 2})
	f := startFake(t, cms, "a")
	f.wantLeader("b", false)
	changed := f.e.Changed()
	for range 3 { // to +13.2 s
		f.step(maxRetry)
		f.wantLeader("b", false)
	}
	// b renews: a counts its lease duration from when it sees that, at
	// its next try (+17.6 s).
	renewed := metav1.NewTime(t0.Add(13 * time.Second).Add(-time.Hour))
	cms.put(t, record.Election{HolderIdentity: "b", LeaseDurationSeconds: 15, AcquireTime: old, RenewTime: renewed, LeaderTransitions: 2})
	for range 4 { // to +30.8 s
		f.step(maxRetry)
		f.wantLeader("b", false)
	}
	if got := cms.record(t).HolderIdentity; got != "b" {
		t.Fatalf("record taken from b at +%v (holder %q)", f.clk.Since(t0), got)
	}
	f.step(maxRetry) // +35.2 s: unchanged for 17.6 s
	f.wantLeader("a", true)
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed")
	}
	took := at(35200 * time.Millisecond)
	wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: took, RenewTime: took,
		LeaderTransitions: 3})
}

// TestElectorRenewsAndReleases: the leader renews every RetryPeriod,
// keeping acquireTime; when its context ends, lead returns and then the
// record is released.
func TestElectorRenewsAndReleases(t *testing.T) {
	cms := &memConfigMaps{}
	f := startFake(t, cms, "a")
	f.wantLeader("a", true)
	for i := range 5 {
		f.step(2 * time.Second)
		d := time.Duration(i+1) * 2 * time.Second
		wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(d)})
	}
	f.stop()
	wantRecord(t, cms, record.Election{LeaseDurationSeconds: 1, AcquireTime: at(10 * time.Second), RenewTime: at(10 * time.Second)})
	f.wantLeader("", false)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.termOver || f.holderAt != "a" {
		t.Fatalf("lead's context ended: %v, with the record held by %q; want true, a (release after lead returned)", f.termOver, f.holderAt)
	}
}

// TestElectorLosesLeadership: a leader whose renewals fail stops leading
// RenewDeadline after the first failed one, and campaigns again.
func TestElectorLosesLeadership(t *testing.T) {
	cms := &memConfigMaps{}
	f := startFake(t, cms, "a")
	f.wantLeader("a", true)
	cms.setDown(true)
	// Renewals fail from +2 s; at +10 s the last one within the deadline.
	for range 5 {
		f.step(2 * time.Second)
		f.wantLeader("a", true)
		f.mu.Lock()
		over := f.termOver
		f.mu.Unlock()
		if over {
			t.Fatalf("lead's context ended at +%v, within RenewDeadline", f.clk.Since(t0))
		}
	}
	f.step(2 * time.Second) // +12 s
	f.wantLeader("", false)
	f.mu.Lock()
	over := f.termOver
	f.mu.Unlock()
	if !over {
		t.Fatal("lead's context did not end RenewDeadline after the first failed renewal")
	}
	// The record still names a: the cloud was out of reach. Once it is
	// back, a, campaigning again, takes its own record at once.
	cms.setDown(false)
	f.step(maxRetry)
	f.wantLeader("a", true)
	testenv.EventuallyWithin(t, 5*time.Second, "lead runs again", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.terms == 2 && !f.termOver
	})
	// The first term's acquireTime, no transition.
	wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0),
		RenewTime: at(12*time.Second + maxRetry)})
}

// TestRecordLockConflict: an update carries the resourceVersion of the
// read it is based on, so a concurrent writer's makes it fail.
func TestRecordLockConflict(t *testing.T) {
	cms := &memConfigMaps{}
	cms.put(t, record.Election{})
	a := &recordLock{get: cms, w: record.ClientWriter{ConfigMaps: cms}, pool: "p1", name: record.ElectionName("p1")}
	b := &recordLock{get: cms, w: record.ClientWriter{ConfigMaps: cms}, pool: "p1", name: record.ElectionName("p1")}
	for _, l := range []*recordLock{a, b} {
		if _, _, err := l.read(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.update(context.Background(), record.Election{HolderIdentity: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := b.update(context.Background(), record.Election{HolderIdentity: "b"}); !apierrors.IsConflict(err) {
		t.Fatalf("second update: %v; want a conflict", err)
	}
	if got := cms.record(t).HolderIdentity; got != "a" {
		t.Fatalf("holder %q, want a", got)
	}
}

func TestNewElectorTimings(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		ok                  bool
	}{
		{0, 0, 0, true},
		{15 * time.Second, 10 * time.Second, 2 * time.Second, true},
		{10 * time.Second, 10 * time.Second, 2 * time.Second, false},
		{15 * time.Second, 10 * time.Second, 9 * time.Second, false},
		{5 * time.Second, 0, 0, false}, // renew deadline's default is 10 s
	} {
		_, err := newElector(Options{Pool: "p1", Node: "a", LeaseDuration: tc.lease, RenewDeadline: tc.renew,
			RetryPeriod: tc.retry}, &memConfigMaps{}, record.ClientWriter{ConfigMaps: &memConfigMaps{}}, testclock.NewFakeClock(t0))
		if (err == nil) != tc.ok {
			t.Errorf("%v/%v/%v: %v", tc.lease, tc.renew, tc.retry, err)
		}
	}
}

// TestElectorReleasesOnlyItsOwn: a leader that stopped renewing in time
// does not release the record another node has taken since.
func TestElectorReleasesOnlyItsOwn(t *testing.T) {
	cms := &memConfigMaps{}
	e, err := newElector(Options{Pool: "p1", Node: "a"}, cms, record.ClientWriter{ConfigMaps: cms}, testclock.NewFakeClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	e.observe(record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15}) // a's last write
	b := record.Election{HolderIdentity: "b", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(0), LeaderTransitions: 1}
	cms.put(t, b)
	e.release()
	wantRecord(t, cms, b)
}

// TestRecordLeaseClampedToConfigured: a holder that wrote a lease far
// longer than the pool's and stopped renewing loses the record once it
// has not changed for this node's own LeaseDuration.
func TestRecordLeaseClampedToConfigured(t *testing.T) {
	cms := &memConfigMaps{}
	cms.put(t, record.Election{HolderIdentity: "thief", LeaseDurationSeconds: 3000000000, AcquireTime: at(0), RenewTime: at(0), LeaderTransitions: 1})
	f := startFake(t, cms, "a")
	f.wantLeader("thief", false)
	for range 3 { // to +13.2 s
		f.step(maxRetry)
		f.wantLeader("thief", false)
	}
	f.step(maxRetry) // +17.6 s: unchanged for more than 15 s
	f.wantLeader("a", true)
	took := at(17600 * time.Millisecond)
	wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: took, RenewTime: took,
		LeaderTransitions: 2})
}

// TestHugeLeaseNoOverflow: a lease so long that it overflows a
// time.Duration once multiplied (here, to a negative one that would read
// as expired at once, or the largest int) is the configured lease: held
// for it, then taken.
func TestHugeLeaseNoOverflow(t *testing.T) {
	for _, secs := range []int{9300000000, math.MaxInt} {
		t.Run(strconv.Itoa(secs), func(t *testing.T) {
			cms := &memConfigMaps{}
			cms.put(t, record.Election{HolderIdentity: "thief", LeaseDurationSeconds: secs, AcquireTime: at(0), RenewTime: at(0)})
			f := startFake(t, cms, "a")
			f.wantLeader("thief", false)
			f.step(maxRetry) // +4.4 s: still held
			f.wantLeader("thief", false)
			for range 3 { // to +17.6 s
				f.step(maxRetry)
			}
			f.wantLeader("a", true)
		})
	}
}
