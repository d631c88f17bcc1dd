package writequeue

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
)

// Rebasing the node's own status.
//
// While the cloud is unreachable, kube-controller-manager marks the
// node's conditions Unknown (after node-monitor-grace-period). The
// kubelet's status patches made offline are differences from its lister,
// the Node as cached before the outage, where Ready is True: a heartbeat
// carries the heartbeat times and no status. Replayed as queued, such a
// patch leaves Ready Unknown upstream, and the node stays NotReady until
// the kubelet's lister has seen the Unknown and its next status tick
// (10 s) patches True again: 3-15 s after the heal.
//
// So the queue rebases a status patch of this node's own Node on the Node
// as it is upstream (just read): it sends the strategic merge patch from
// that Node to the same Node with the conditions the component last
// wrote (its queued patch applied to the base it was made against, the
// edge's answer to it). Conditions it never wrote, and other status
// fields it did not change, stay as upstream has them. Two cases:
//
//   - another field manager wrote the status after the write was queued
//     (managedFields): the write is obsolete, and only its conditions are
//     sent (withBody false);
//   - kube-apiserver v1.36 keeps no managedFields on Nodes, so mostly the
//     change shows only as conditions upstream that the queued patch
//     applied alone would not turn into the component's: then the patch
//     is sent applied to the upstream Node, with those conditions
//     (withBody true).
//
// Ready=True then lands at the replay. The conditions come from the
// queued write, not from the edge's cache: by the time of the replay the
// component's watch may have put the upstream Node (with the Unknown) in
// the cache.

// rebases reports whether w is a status patch of this node's own Node
// that can be rebased: a strategic merge or JSON merge patch kept with
// its base.
func (q *Queue) rebases(w cache.QueuedWrite) bool {
	return q.node != "" && w.Group == "" && w.Resource == "nodes" && w.Name == q.node &&
		w.Method == http.MethodPatch && len(w.Base) > 0 && statuspatch.Diffable(w.ContentType)
}

// errNothingToRebase: upstream already has the conditions w wrote.
var errNothingToRebase = errors.New("upstream has the conditions the write set")

// rebase returns the strategic merge patch that sets, on the Node as it
// is upstream (cur), the conditions w's component last wrote; withBody,
// on cur with w applied. A condition whose status changes gets now as
// its lastTransitionTime, as kubelet sets it when the status it computes
// differs from the Node's. errNothingToRebase: the conditions are
// already so.
func rebase(w cache.QueuedWrite, cur []byte, now time.Time, withBody bool) ([]byte, error) {
	last, err := statuspatch.Apply(w.ContentType, w.Base, w.Body, w.Resource)
	if err != nil {
		return nil, fmt.Errorf("apply the queued patch to its base: %w", err)
	}
	start := cur
	if withBody {
		if start, err = statuspatch.Apply(w.ContentType, cur, w.Body, w.Resource); err != nil {
			return nil, fmt.Errorf("apply the queued patch to the upstream object: %w", err)
		}
	}
	var up, lw map[string]any
	if err := json.Unmarshal(start, &up); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(last, &lw); err != nil {
		return nil, err
	}
	want := conditions(lw)
	if len(want) == 0 {
		return nil, errNothingToRebase
	}
	have := conditions(up)
	changed := false
	for _, c := range want {
		i := indexOfType(have, c["type"])
		if i >= 0 && reflect.DeepEqual(have[i], c) {
			continue
		}
		changed = true
		if i < 0 {
			have = append(have, c)
			continue
		}
		if have[i]["status"] != c["status"] {
			c["lastTransitionTime"] = now.UTC().Format(time.RFC3339)
		}
		have[i] = c
	}
	if !changed {
		return nil, errNothingToRebase
	}
	st, _ := up["status"].(map[string]any)
	if st == nil {
		st = map[string]any{}
		up["status"] = st
	}
	list := make([]any, len(have))
	for i, c := range have {
		list[i] = c
	}
	st["conditions"] = list
	target, err := json.Marshal(up)
	if err != nil {
		return nil, err
	}
	return statuspatch.Between(statuspatch.StrategicMerge, cur, target, w.Resource)
}

// conditions are status.conditions of a decoded object.
func conditions(o map[string]any) []map[string]any {
	st, _ := o["status"].(map[string]any)
	l, _ := st["conditions"].([]any)
	out := make([]map[string]any, 0, len(l))
	for _, c := range l {
		if m, ok := c.(map[string]any); ok && m["type"] != nil {
			out = append(out, m)
		}
	}
	return out
}

func indexOfType(cs []map[string]any, typ any) int {
	for i, c := range cs {
		if c["type"] == typ {
			return i
		}
	}
	return -1
}
