package autonomy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/openyurt"
)

func TestNodeSetting(t *testing.T) {
	forever := Setting{Autonomous: true}
	for _, tc := range []struct {
		ann     map[string]string
		want    Setting
		wantErr bool
	}{
		{nil, Setting{}, false},
		{map[string]string{openyurt.AutonomyAnnotation: "true"}, forever, false},
		{map[string]string{openyurt.AutonomyAnnotation: "false"}, Setting{}, false},
		{map[string]string{openyurt.AutonomyAnnotation: "yes"}, Setting{}, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "0"}, forever, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "0s"}, forever, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "-1h"}, forever, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "24h"}, Setting{true, ptr.To[int64](86400)}, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "1500ms"}, Setting{true, ptr.To[int64](2)}, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "1ns"}, Setting{true, ptr.To[int64](1)}, false},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "a day"}, Setting{}, true},
		{map[string]string{openyurt.AutonomyDurationAnnotation: "3600"}, Setting{}, true}, // Go durations need a unit
		// The old annotation wins, as in OpenYurt.
		{map[string]string{openyurt.AutonomyAnnotation: "true", openyurt.AutonomyDurationAnnotation: "1h"}, forever, false},
		{map[string]string{openyurt.AutonomyAnnotation: "true", openyurt.AutonomyDurationAnnotation: "bad"}, forever, false},
	} {
		got, err := NodeSetting(tc.ann)
		if !got.Equal(tc.want) || (err != nil) != tc.wantErr {
			t.Errorf("NodeSetting(%v) = %v, %v; want %v, error %v", tc.ann, got, err, tc.want, tc.wantErr)
		}
	}
}

// defaults are the tolerations the DefaultTolerationSeconds admission
// plugin gives a pod.
func defaults(secs int64) []corev1.Toleration {
	return []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(secs)},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(secs)},
	}
}

func withSeconds(ts []corev1.Toleration, secs *int64) []corev1.Toleration {
	for i := range ts {
		ts[i].TolerationSeconds = secs
	}
	return ts
}

func originals(notReady, unreachable string) map[string]*string {
	return map[string]*string{openyurt.OriginalNotReadyTolerationAnnotation: &notReady, openyurt.OriginalUnreachableTolerationAnnotation: &unreachable}
}

func TestPlan(t *testing.T) {
	forever := Setting{Autonomous: true}
	hour := Setting{Autonomous: true, Seconds: ptr.To[int64](3600)}
	recorded := map[string]string{openyurt.OriginalNotReadyTolerationAnnotation: "300", openyurt.OriginalUnreachableTolerationAnnotation: "300"}
	gpu := corev1.Toleration{Key: "example.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)}
	all := corev1.Toleration{Operator: corev1.TolerationOpExists}
	for _, tc := range []struct {
		name        string
		tols        []corev1.Toleration
		ann         map[string]string
		s           Setting
		want        change
		wantChanged bool
	}{
		{name: "defaults, forever", tols: defaults(300), s: forever,
			want: change{withSeconds(defaults(300), nil), originals("300", "300")}, wantChanged: true},
		{name: "defaults, an hour", tols: defaults(300), s: hour,
			want: change{withSeconds(defaults(300), ptr.To[int64](3600)), originals("300", "300")}, wantChanged: true},
		{name: "applied already", tols: withSeconds(defaults(300), nil), ann: recorded, s: forever,
			want: change{withSeconds(defaults(300), nil), map[string]*string{}}},
		{name: "bound changed: the originals stay", tols: withSeconds(defaults(300), nil), ann: recorded, s: hour,
			want: change{withSeconds(defaults(300), ptr.To[int64](3600)), map[string]*string{}}, wantChanged: true},
		{name: "restored", tols: withSeconds(defaults(300), nil), ann: recorded, s: Setting{},
			want:        change{defaults(300), map[string]*string{openyurt.OriginalNotReadyTolerationAnnotation: nil, openyurt.OriginalUnreachableTolerationAnnotation: nil}},
			wantChanged: true},
		{name: "never autonomous", tols: defaults(300), s: Setting{}, want: change{defaults(300), map[string]*string{}}},
		{name: "no tolerations: added, originally absent", s: forever,
			want: change{withSeconds(defaults(0), nil), originals(absent, absent)}, wantChanged: true},
		{name: "absent restored to 0 (evicted at once, as without)", tols: withSeconds(defaults(0), nil),
			ann:         map[string]string{openyurt.OriginalNotReadyTolerationAnnotation: absent, openyurt.OriginalUnreachableTolerationAnnotation: absent},
			want:        change{defaults(0), map[string]*string{openyurt.OriginalNotReadyTolerationAnnotation: nil, openyurt.OriginalUnreachableTolerationAnnotation: nil}},
			wantChanged: true},
		{name: "no tolerationSeconds recorded as infinite", tols: withSeconds(defaults(0), nil), s: hour,
			want: change{withSeconds(defaults(0), ptr.To[int64](3600)), originals(infinite, infinite)}, wantChanged: true},
		{name: "other tolerations kept", tols: append([]corev1.Toleration{gpu}, defaults(300)...), s: forever,
			want: change{append([]corev1.Toleration{gpu}, withSeconds(defaults(300), nil)...), originals("300", "300")}, wantChanged: true},
		{name: "a wildcard toleration is the pod's own", tols: []corev1.Toleration{all}, s: hour,
			want: change{[]corev1.Toleration{all}, map[string]*string{}}},
		{name: "an unparsable original is left", tols: withSeconds(defaults(300), nil),
			ann:         map[string]string{openyurt.OriginalNotReadyTolerationAnnotation: "soon", openyurt.OriginalUnreachableTolerationAnnotation: "300"},
			want:        change{append(withSeconds(defaults(300)[:1], nil), defaults(300)[1]), map[string]*string{openyurt.OriginalUnreachableTolerationAnnotation: nil}},
			wantChanged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.ann}, Spec: corev1.PodSpec{Tolerations: tc.tols}}
			before := pod.DeepCopy()
			got, changed := plan(pod, tc.s)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if d := cmp.Diff(tc.want.tolerations, got.tolerations); d != "" && (len(tc.want.tolerations) > 0 || len(got.tolerations) > 0) {
				t.Errorf("tolerations (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.want.annotations, got.annotations); d != "" {
				t.Errorf("annotations (-want +got):\n%s", d)
			}
			if d := cmp.Diff(before, pod); d != "" {
				t.Errorf("plan changed the pod:\n%s", d)
			}
		})
	}
}
