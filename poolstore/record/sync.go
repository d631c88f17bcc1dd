package record

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// SyncLeaseSeconds is the sync record's duration: a leader's sync older
// than that is stale (DESIGN: followers serve from the replica while the
// leader's sync is at most 30 s old). The gateway writes no longer one.
const SyncLeaseSeconds = 30

// Sync is the leader-informer-sync record, Namespace/SyncName(pool): a
// ConfigMap whose data names the leader and when its watches were last
// seen synced.
type Sync struct {
	HolderIdentity       string    // data holderIdentity
	RenewTime            time.Time // data renewTime, RFC 3339 with nanoseconds
	LeaseDurationSeconds int       // data leaseDurationSeconds
}

// Data is the record as the ConfigMap's data.
func (r Sync) Data() map[string]string {
	return map[string]string{"holderIdentity": r.HolderIdentity, "renewTime": r.RenewTime.UTC().Format(time.RFC3339Nano),
		"leaseDurationSeconds": strconv.Itoa(r.LeaseDurationSeconds)}
}

// DecodeSync is cm's sync record; every key must be there.
func DecodeSync(cm *corev1.ConfigMap) (Sync, error) {
	d := cm.Data
	for _, k := range []string{"holderIdentity", "renewTime", "leaseDurationSeconds"} {
		if _, ok := d[k]; !ok {
			return Sync{}, fmt.Errorf("sync record without %s", k)
		}
	}
	renew, err := time.Parse(time.RFC3339Nano, d["renewTime"])
	if err != nil {
		return Sync{}, fmt.Errorf("sync record renewTime: %w", err)
	}
	secs, err := strconv.Atoi(d["leaseDurationSeconds"])
	if err != nil {
		return Sync{}, fmt.Errorf("sync record leaseDurationSeconds: %w", err)
	}
	return Sync{HolderIdentity: d["holderIdentity"], RenewTime: renew, LeaseDurationSeconds: secs}, nil
}
