package feed_test

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
)

func signer(t *testing.T, ca *testenv.CA, name string) (*testenv.KeyPair, *feed.Verifier) {
	t.Helper()
	kp, err := ca.ServerCert("gateway", name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := feed.NewVerifier(feed.VerifierOptions{Roots: ca.Pool, Names: []string{name}})
	if err != nil {
		t.Fatal(err)
	}
	return kp, v
}

func TestSignedStatementVerifies(t *testing.T) {
	ca := testenv.MustCA(t, "gateway-ca")
	kp, v := signer(t, ca, "tether-gateway")
	h := feed.Header{Kind: feed.KindAttest, Feed: "gw-1", T: time.Now(), Resource: "core/v1/services", To: 42, Root: feed.NewTree().Root()}
	s, err := feed.Sign(kp.TLS.PrivateKey.(crypto.Signer), kp.TLS.Certificate[0], h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Open(s); !errors.Is(err, feed.ErrUnknownKey) {
		t.Fatalf("before its chain: %v, want ErrUnknownKey", err)
	}
	if err := v.AddChain(kp.TLS.Certificate); err != nil {
		t.Fatal(err)
	}
	got, err := v.Open(s)
	if err != nil {
		t.Fatal(err)
	}
	if got.To != 42 || got.Resource != h.Resource || got.Root != h.Root {
		t.Fatalf("opened %+v, signed %+v", got, h)
	}
	if _, err := v.OpenKind(s, feed.KindMark); !errors.Is(err, feed.ErrBadStatement) {
		t.Fatalf("an attestation opened as a mark: %v, want ErrBadStatement", err)
	}
	if _, err := v.OpenKind(s, feed.KindAttest); err != nil {
		t.Fatalf("OpenKind of its own kind: %v", err)
	}
	// One byte of the header changed: the signature no longer holds.
	bad := s
	bad.H = bytes.Replace(s.H, []byte(`"to":42`), []byte(`"to":43`), 1)
	if bytes.Equal(bad.H, s.H) {
		t.Fatal("test did not alter the header")
	}
	if _, err := v.Open(bad); !errors.Is(err, feed.ErrBadSignature) {
		t.Fatalf("altered header: %v, want ErrBadSignature", err)
	}
}

func TestChainOfAnotherCAOrNameRefused(t *testing.T) {
	ca := testenv.MustCA(t, "gateway-ca")
	_, v := signer(t, ca, "tether-gateway")
	forger := testenv.MustCA(t, "forger")
	kp, err := forger.ServerCert("gateway", "tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.AddChain(kp.TLS.Certificate); !errors.Is(err, feed.ErrBadChain) {
		t.Fatalf("chain of another CA: %v, want ErrBadChain", err)
	}
	other, err := ca.ServerCert("gateway", "somewhere-else")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.AddChain(other.TLS.Certificate); !errors.Is(err, feed.ErrBadChain) {
		t.Fatalf("chain for another name: %v, want ErrBadChain", err)
	}
	client, err := ca.ClientCert("system:node:edge-1", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.AddChain(client.TLS.Certificate); !errors.Is(err, feed.ErrBadChain) {
		t.Fatalf("a client certificate: %v, want ErrBadChain", err)
	}
}

func TestTreeRootDependsOnEveryObject(t *testing.T) {
	a, b := feed.NewTree(), feed.NewTree()
	var edits []feed.Edit
	for i := range 1000 {
		edits = append(edits, feed.Edit{Key: feed.Key("ns", fmt.Sprint("svc-", i)), Raw: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	a.Apply(edits)
	for i := len(edits) - 1; i >= 0; i-- { // another order, same set
		b.Set(edits[i].Key, edits[i].Raw)
	}
	if a.Root() != b.Root() {
		t.Fatal("same objects, different roots")
	}
	root := a.Root()
	change := []feed.Edit{{Key: feed.Key("ns", "svc-7"), Raw: []byte(`{"n":-7}`)}}
	if got := a.RootWith(change); got == root {
		t.Fatal("an altered object left the root as it was")
	}
	if a.Root() != root {
		t.Fatal("RootWith changed the tree")
	}
	want := a.RootWith(change)
	a.Apply(change)
	if a.Root() != want {
		t.Fatal("RootWith and Apply disagree")
	}
	del := []feed.Edit{{Key: feed.Key("ns", "svc-9")}}
	if a.RootWith(del) == a.Root() {
		t.Fatal("a deleted object left the root as it was")
	}
	add := []feed.Edit{{Key: feed.Key("default", "kubernetes"), Raw: []byte(`{}`)}}
	if a.RootWith(add) == a.Root() {
		t.Fatal("an added object left the root as it was")
	}
	if a.Len() != 1000 {
		t.Fatalf("Len %d", a.Len())
	}
}

// BenchmarkOpen is what a member pays per statement: one signature check
// (the test PKI's ECDSA P-256, as the gateway's self-managed CA issues).
func BenchmarkOpen(b *testing.B) {
	ca := testenv.MustCA(b, "gateway-ca")
	kp, err := ca.ServerCert("gateway", "tether-gateway")
	if err != nil {
		b.Fatal(err)
	}
	v, err := feed.NewVerifier(feed.VerifierOptions{Roots: ca.Pool, Names: []string{"tether-gateway"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := v.AddChain(kp.TLS.Certificate); err != nil {
		b.Fatal(err)
	}
	s, err := feed.Sign(kp.TLS.PrivateKey.(crypto.Signer), kp.TLS.Certificate[0], feed.Header{Kind: feed.KindAttest,
		Feed: "gw-1", T: time.Now(), Resource: "core/v1/services", To: 42, Root: feed.NewTree().Root()})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := v.Open(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRootWith is a member's check of one changed object among
// 1,000 (the bench's EndpointSlices): one bucket and the root rehashed.
func BenchmarkRootWith(b *testing.B) {
	t := feed.NewTree()
	raw := bytes.Repeat([]byte("x"), 1350)
	for i := range 1000 {
		t.Set(feed.Key("bench", fmt.Sprint("svc-", i)), raw)
	}
	t.Root()
	edit := []feed.Edit{{Key: feed.Key("bench", "svc-7"), Raw: append(raw, 'y')}}
	for b.Loop() {
		t.RootWith(edit)
	}
}
