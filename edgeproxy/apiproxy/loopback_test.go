package apiproxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestLoopback: tether-edge's own clients reach the proxy in process and
// are known by their context, never by their User-Agent: the pool's Node
// informer's reads are cached and served offline, the pool's own are not,
// and a local client that sends the informer's User-Agent is one more
// component (not cached, "other" in metrics).
func TestLoopback(t *testing.T) {
	f := newFakeAPIServer(t)
	offline := &switchable{}
	e := edgeFor(t, f, offline)
	client := func(c Internal) kubernetes.Interface {
		l := NewLoopback(c)
		l.Bind(e.Proxy)
		k, err := kubernetes.NewForConfig(&rest.Config{Host: "http://in-process", Transport: l, UserAgent: c.Name + "/test"})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	members, pool := client(PoolMembersClient), client(PoolClient)
	ctx := context.Background()
	byUA := func() int {
		req, _ := http.NewRequest("GET", "http://"+e.Addr+"/api/v1/namespaces/ns/pods", nil)
		req.Header.Set("User-Agent", PoolMembersClient.Name+"/v9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	for _, c := range []kubernetes.Interface{members, pool} {
		l, err := c.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 || l.Items[0].Name != "p" {
			t.Fatalf("online list: %v, %v", l, err)
		}
	}
	if code := byUA(); code != http.StatusOK {
		t.Errorf("online list by a local client: %d", code)
	}
	// The proxy counts a request once its handler returns, which may be
	// just after the client has read the last byte of a response of known
	// length: wait for the count.
	for _, comp := range []string{PoolMembersClient.Name, PoolClient.Name, "other"} {
		lists := func() float64 {
			return e.metric("tether_edge_apiserver_requests_total", "component", comp, "verb", "list", "served", "upstream")
		}
		testenv.Eventually(t, comp+"'s list counted", func() bool { return lists() > 0 })
		if n := lists(); n != 1 {
			t.Errorf("%s: %v lists counted", comp, n)
		}
	}

	offline.set(true)
	e.waitHealthy(false, 30*time.Second)
	// The online answer is copied into the cache in the background.
	testenv.EventuallyNoError(t, "an offline list of the Node informer's client, from the cache", func() error {
		l, err := members.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
		if err == nil && (len(l.Items) != 1 || l.Items[0].Name != "p") {
			err = fmt.Errorf("listed %v", l.Items)
		}
		return err
	})
	if n := e.metric("tether_edge_apiserver_requests_total", "component", PoolMembersClient.Name, "verb", "list", "served", "cache"); n == 0 {
		t.Error("the offline list was not counted as served from the cache")
	}
	if _, err := pool.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("offline list of the pool's client: %v, want 503 (never cached)", err)
	}
	if code := byUA(); code != http.StatusServiceUnavailable {
		t.Errorf("offline list by a local client with the informer's User-Agent: %d, want 503", code)
	}
}

// TestLoopbackUnbound: requests before Bind fail with an error that says
// why.
func TestLoopbackUnbound(t *testing.T) {
	l := NewLoopback(TopologyClient)
	req, _ := http.NewRequest("GET", "http://in-process/api/v1/nodes", nil)
	if _, err := l.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "not running yet") {
		t.Errorf("before Bind: %v", err)
	}
}
