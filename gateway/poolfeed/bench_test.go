package poolfeed

import (
	"crypto"
	"fmt"
	"strconv"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
)

// BenchmarkUnit is the gateway's cost of one unit of one changed
// EndpointSlice (5 endpoints) among 1,000: encode it, hash it into the
// tree, sign the attestation and encode the unit's frame. BenchmarkWhole
// is a subscriber's whole-resource unit of the 1,000, encoded.
func BenchmarkUnit(b *testing.B) {
	f, r, lw := benchFeed(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		es := endpointSlice(fmt.Sprintf("svc-%d", i%1000), 5)
		es.Namespace, es.ResourceVersion = "app", strconv.Itoa(2000+i)
		k, raw, err := lw.encode(es)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.apply(r, []change{{string(watch.Modified), k, raw}}, uint64(2000+i)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWhole(b *testing.B) {
	f, r, _ := benchFeed(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		f.mu.Lock()
		r.snap = nil
		if _, err := f.snapshotLocked(r); err != nil {
			b.Fatal(err)
		}
		f.mu.Unlock()
	}
}

func benchFeed(b *testing.B) (*Feed, *resource, listWatcher) {
	kc, err := kube.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		b.Fatal(err)
	}
	ca := testenv.MustCA(b, "bench-ca")
	kp, err := ca.ServerCert("gateway", gatewayName)
	if err != nil {
		b.Fatal(err)
	}
	f, err := New(Options{Client: kc, Name: "gateway-0", Resources: feed.DefaultResources[:1],
		Signer: func() (crypto.Signer, [][]byte, error) {
			return kp.TLS.PrivateKey.(crypto.Signer), kp.TLS.Certificate, nil
		}})
	if err != nil {
		b.Fatal(err)
	}
	if err := f.refreshCert(); err != nil {
		b.Fatal(err)
	}
	r := f.res[0]
	lw := listWatcher{gvk: discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")}
	var changes []change
	for i := range 1000 {
		es := endpointSlice(fmt.Sprintf("svc-%d", i), 5)
		es.Namespace, es.ResourceVersion = "app", strconv.Itoa(1+i)
		k, raw, err := lw.encode(es)
		if err != nil {
			b.Fatal(err)
		}
		changes = append(changes, change{string(watch.Added), k, raw})
	}
	if err := f.apply(r, changes, 1000); err != nil {
		b.Fatal(err)
	}
	return f, r, lw
}
