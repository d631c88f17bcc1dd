package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/e2e/world"
)

// kubeProxyUA is the User-Agent of the watchers: the proxy counts and
// treats them as kube-proxy.
const kubeProxyUA = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/bench"

// watcher is a kube-proxy-like informer on EndpointSlices of all
// namespaces through one edge's apiserver proxy. It notes when it
// receives each slice of namespace bench carrying the current round's
// marker.
type watcher struct {
	edge *world.Edge
	stop chan struct{}
	inf  cache.SharedIndexInformer

	mu      sync.Mutex
	round   int
	got     []time.Time // by slice index, for round
	missing int         // slices of round not yet received
	done    chan struct{}
}

func startWatcher(e *world.Edge, n int) (*watcher, error) {
	c, err := kubernetes.NewForConfig(&rest.Config{
		Host:      "http://127.0.0.1:10261",
		Dial:      e.Host.DialContext,
		UserAgent: kubeProxyUA,
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", e.Name, err)
	}
	w := &watcher{edge: e, stop: make(chan struct{}), got: make([]time.Time, n)}
	w.inf = informers.NewSharedInformerFactory(c, 0).Discovery().V1().EndpointSlices().Informer()
	_, err = w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.receive(obj) },
		UpdateFunc: func(_, obj any) { w.receive(obj) },
	})
	if err != nil {
		return nil, err
	}
	go w.inf.Run(w.stop)
	return w, nil
}

// receive notes the time obj arrived if it is a slice of the current
// round, the first time.
func (w *watcher) receive(obj any) {
	now := time.Now()
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || es.Namespace != benchNS || len(es.Endpoints) == 0 || len(es.Endpoints[0].Addresses) == 0 {
		return
	}
	r, i, ok := parseMarker(es.Endpoints[0].Addresses[0])
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok || r != w.round || w.round == 0 || i >= len(w.got) || !w.got[i].IsZero() {
		return
	}
	w.got[i] = now
	w.missing--
	if w.missing == 0 {
		close(w.done)
	}
}

// expect starts round r: from now on receive notes the slices with its
// marker.
func (w *watcher) expect(r int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.round = r
	clear(w.got)
	w.missing = len(w.got)
	w.done = make(chan struct{})
}

// wait waits until every slice of the round was received, or ctx ends;
// it returns the receive times (zero for those missing).
func (w *watcher) wait(ctx context.Context) ([]time.Time, error) {
	w.mu.Lock()
	done := w.done
	w.mu.Unlock()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("%s: %d of %d changes not received: %w", w.edge.Name, w.missing, len(w.got), err)
	}
	return append([]time.Time(nil), w.got...), err
}

// synced reports whether the informer has listed, and how many slices of
// namespace bench it holds.
func (w *watcher) synced() (bool, int) {
	if !w.inf.HasSynced() {
		return false, 0
	}
	n := 0
	for _, obj := range w.inf.GetStore().List() {
		if es, ok := obj.(*discoveryv1.EndpointSlice); ok && es.Namespace == benchNS {
			n++
		}
	}
	return true, n
}

func (w *watcher) close() { close(w.stop) }

// parseMarker reads round and slice index from a first endpoint address
// 10.r.a.b (see marker).
func parseMarker(addr string) (r, i int, ok bool) {
	f := strings.Split(addr, ".")
	if len(f) != 4 || f[0] != "10" {
		return 0, 0, false
	}
	var v [3]int
	for k := range v {
		n, err := strconv.Atoi(f[k+1])
		if err != nil {
			return 0, 0, false
		}
		v[k] = n
	}
	if v[2] < 1 {
		return 0, 0, false
	}
	return v[0], v[1]*250 + v[2] - 1, true
}
