package kube

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestTyped runs every verb of a Typed client against a real
// kube-apiserver, in protobuf (the default) and in JSON.
func TestTyped(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	for _, tc := range []struct{ contentType, want string }{
		{"", "application/vnd.kubernetes.protobuf"},
		{"application/json", "application/json"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfg := rest.CopyConfig(cp.Admin)
			cfg.ContentType = tc.contentType
			seen := &contentTypes{}
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return seen.wrap(rt) })
			kc, err := NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ns := "kube-" + map[string]string{"": "proto", "application/json": "json"}[tc.contentType]
			if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cms := kc.ConfigMaps(ns)
			w, err := cms.Watch(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"k": "v"}},
				Data: map[string]string{"x": "1"}}, metav1.CreateOptions{})
			if err != nil || cm.Namespace != ns || cm.ResourceVersion == "" {
				t.Fatalf("create: %+v, %v", cm, err)
			}
			cm.Data["x"] = "2"
			if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil || cm.Data["x"] != "2" {
				t.Fatalf("update: %v", err)
			}
			stale := cm.DeepCopy()
			stale.ResourceVersion = "1"
			if _, err := cms.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
				t.Errorf("update with an old resourceVersion: %v, want a conflict", err)
			}
			if cm, err = cms.Patch(ctx, "a", types.MergePatchType, []byte(`{"data":{"y":"3"}}`), metav1.PatchOptions{}); err != nil || cm.Data["y"] != "3" {
				t.Fatalf("patch: %v", err)
			}
			if got, err := cms.Get(ctx, "a", metav1.GetOptions{}); err != nil || got.ResourceVersion != cm.ResourceVersion {
				t.Fatalf("get: %+v, %v", got, err)
			}
			l, err := kc.ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "k=v"})
			if err != nil || len(l.Items) != 1 || l.Items[0].Namespace != ns {
				t.Fatalf("list across namespaces with a selector: %+v, %v", l, err)
			}
			if err := cms.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := cms.Get(ctx, "a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("get after delete: %v", err)
			}
			var events []watch.EventType
			for len(events) < 4 {
				select {
				case ev := <-w.ResultChan():
					if _, ok := ev.Object.(*corev1.ConfigMap); !ok {
						t.Fatalf("watch event %s of %T", ev.Type, ev.Object)
					}
					events = append(events, ev.Type)
				case <-ctx.Done():
					t.Fatalf("watch: only %v", events)
				}
			}
			if want := []watch.EventType{watch.Added, watch.Modified, watch.Modified, watch.Deleted}; !slices.Equal(events, want) {
				t.Errorf("watch events %v, want %v", events, want)
			}
			if n, err := kc.Nodes().List(ctx, metav1.ListOptions{}); err != nil || n == nil {
				t.Errorf("cluster-scoped list: %v", err)
			}
			if _, err := kc.EndpointSlices(ns).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("discovery/v1 list: %v", err)
			}
			if _, err := kc.Leases(ns).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("coordination/v1 list: %v", err)
			}
			if _, err := kc.CertificateSigningRequests().List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("certificates/v1 list: %v", err)
			}
			got := seen.all()
			if len(got) == 0 || slices.ContainsFunc(got, func(ct string) bool { return !strings.HasPrefix(ct, tc.want) }) {
				t.Errorf("answers in %v, want all %s", got, tc.want)
			}
		})
	}
}

type contentTypes struct {
	mu  sync.Mutex
	got []string
}

func (c *contentTypes) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err == nil && resp.StatusCode < 300 {
			c.mu.Lock()
			c.got = append(c.got, resp.Header.Get("Content-Type"))
			c.mu.Unlock()
		}
		return resp, err
	})
}

func (c *contentTypes) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
