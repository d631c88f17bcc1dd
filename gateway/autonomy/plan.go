package autonomy

import (
	"fmt"
	"math"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/tether-edge/tether/internal/openyurt"
)

// Setting is what a Node's annotations ask of its pods.
type Setting struct {
	// Autonomous: the pods tolerate the node's unreachable and not-ready
	// taints for Seconds.
	Autonomous bool
	// Seconds is the bound; nil is forever.
	Seconds *int64
}

// String is the setting as the logs show it.
func (s Setting) String() string {
	switch {
	case !s.Autonomous:
		return "off"
	case s.Seconds == nil:
		return "forever"
	}
	return (time.Duration(*s.Seconds) * time.Second).String()
}

// Equal reports whether s and o ask the same.
func (s Setting) Equal(o Setting) bool {
	if s.Autonomous != o.Autonomous || (s.Seconds == nil) != (o.Seconds == nil) {
		return false
	}
	return s.Seconds == nil || *s.Seconds == *o.Seconds
}

// NodeSetting reads a Node's annotations as OpenYurt does:
// openyurt.AutonomyAnnotation "true" is autonomy forever and wins;
// otherwise openyurt.AutonomyDurationAnnotation, a Go duration, is
// autonomy for that long, forever when it is not above zero ("0"). A
// duration that does not parse is no autonomy, and the error says why. A
// bound is rounded up to whole seconds, so that a positive one never
// becomes 0 (which would evict at once).
func NodeSetting(annotations map[string]string) (Setting, error) {
	if annotations[openyurt.AutonomyAnnotation] == "true" {
		return Setting{Autonomous: true}, nil
	}
	v, ok := annotations[openyurt.AutonomyDurationAnnotation]
	if !ok {
		return Setting{}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return Setting{}, fmt.Errorf("annotation %s: %w", openyurt.AutonomyDurationAnnotation, err)
	}
	if d <= 0 {
		return Setting{Autonomous: true}, nil
	}
	secs := int64(math.Ceil(d.Seconds()))
	return Setting{Autonomous: true, Seconds: &secs}, nil
}

// The taints autonomy tolerates, each with the pod annotation that keeps
// the tolerationSeconds the pod had before.
var held = [...]struct{ taint, original string }{
	{corev1.TaintNodeNotReady, openyurt.OriginalNotReadyTolerationAnnotation},
	{corev1.TaintNodeUnreachable, openyurt.OriginalUnreachableTolerationAnnotation},
}

// infinite is the original of a toleration without tolerationSeconds
// (OpenYurt's word).
const infinite = "infinite"

// absent is the original recorded when the pod had no toleration of the
// taint and one was added: tolerationSeconds 0 evicts at once, as no
// toleration does, and validation lets no toleration be removed.
const absent = "0"

// change is what a pod needs: its whole tolerations list, and annotations
// to set (a nil value removes one).
type change struct {
	tolerations []corev1.Toleration
	annotations map[string]*string
}

// plan returns the change that makes pod's tolerations follow s, and
// whether there is one. With autonomy, each toleration of the taint's own
// key with effect NoExecute gets tolerationSeconds s.Seconds, its former
// value recorded once in the original annotation; a pod that tolerates the
// taint by no toleration at all gets one (operator Exists, effect
// NoExecute) with the original "0". Tolerations by an empty key or an
// empty effect are the pod's own and are left alone: they tolerate without
// a bound (validation allows tolerationSeconds on NoExecute only), so they
// never shorten what autonomy sets. Without autonomy, a recorded original
// is put back and its annotation removed. Validation lets a pod update
// add tolerations and change their tolerationSeconds, nothing else; plan
// does no more.
func plan(pod *corev1.Pod, s Setting) (change, bool) {
	c := change{tolerations: make([]corev1.Toleration, len(pod.Spec.Tolerations)), annotations: map[string]*string{}}
	for i := range pod.Spec.Tolerations {
		pod.Spec.Tolerations[i].DeepCopyInto(&c.tolerations[i])
	}
	for _, h := range held {
		recorded, hasRecord := pod.Annotations[h.original]
		if !s.Autonomous {
			if !hasRecord {
				continue
			}
			secs, ok := parseOriginal(recorded)
			if !ok {
				continue // not ours to guess: left as it is
			}
			for i := range c.tolerations {
				if own(&c.tolerations[i], h.taint) {
					c.tolerations[i].TolerationSeconds = copySeconds(secs)
				}
			}
			c.annotations[h.original] = nil
			continue
		}
		found := false
		for i := range c.tolerations {
			t := &c.tolerations[i]
			if !own(t, h.taint) {
				continue
			}
			if !found && !hasRecord {
				c.annotations[h.original] = formatOriginal(t.TolerationSeconds)
			}
			found = true
			t.TolerationSeconds = copySeconds(s.Seconds)
		}
		if !found && !toleratedByAny(c.tolerations, h.taint) {
			c.tolerations = append(c.tolerations, corev1.Toleration{Key: h.taint, Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: copySeconds(s.Seconds)})
			if !hasRecord {
				v := absent
				c.annotations[h.original] = &v
			}
		}
	}
	changed := len(c.annotations) > 0 || !equality.Semantic.DeepEqual(c.tolerations, pod.Spec.Tolerations)
	return c, changed
}

// own reports whether t is a toleration of taint's key with effect
// NoExecute that tolerates it: one whose tolerationSeconds autonomy sets.
func own(t *corev1.Toleration, taint string) bool {
	return t.Key == taint && t.Effect == corev1.TaintEffectNoExecute && tolerates(t)
}

// toleratedByAny reports whether a toleration in ts tolerates the NoExecute
// taint of that key (without a value, as the node lifecycle controller
// sets it).
func toleratedByAny(ts []corev1.Toleration, taint string) bool {
	for i := range ts {
		t := &ts[i]
		if (t.Key == taint || (t.Key == "" && t.Operator == corev1.TolerationOpExists)) &&
			(t.Effect == corev1.TaintEffectNoExecute || t.Effect == "") && tolerates(t) {
			return true
		}
	}
	return false
}

// tolerates reports whether t's operator and value accept a taint without
// a value.
func tolerates(t *corev1.Toleration) bool {
	switch t.Operator {
	case corev1.TolerationOpExists:
		return true
	case corev1.TolerationOpEqual, "":
		return t.Value == ""
	}
	return false
}

func copySeconds(s *int64) *int64 {
	if s == nil {
		return nil
	}
	v := *s
	return &v
}

func formatOriginal(s *int64) *string {
	v := infinite
	if s != nil {
		v = strconv.FormatInt(*s, 10)
	}
	return &v
}

// parseOriginal reads an original annotation: seconds, or nil for
// infinite; ok is false when it is neither.
func parseOriginal(v string) (secs *int64, ok bool) {
	if v == infinite {
		return nil, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, false
	}
	return &n, true
}
