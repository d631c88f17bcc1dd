// Package feed is the signed pool feed: what a gateway replica attests
// about the pool-scope resources it list/watches for every pool, and how a
// pool member checks it. The gateway is the source of a pool's data; the
// pool leader relays it to the members over the LAN; the members verify
// it against the gateway's certificate chain, so a leader (or a thief
// holding a member's key) can withhold data but never forge, alter,
// delete or roll it back (docs/design.md, "The node pool").
//
// Two statements are signed, each a Header:
//
//   - an attestation (KindAttest): "resource R, after the cloud's
//     resourceVersion To, has the objects whose root hash is Root";
//   - a mark (KindMark), every MarkEvery while the replica's watches are
//     synced: "at time T, each resource was at (To, Root)". A member counts
//     its replica fresh only from a mark its state covers.
//
// The root is a hash of the resource's objects (Tree): a member applies
// the changes it receives to a copy of the affected buckets and commits
// them only if the resulting root equals an attested one, so any object
// added, altered or left out shows.
//
// Statements are signed by the gateway replica's TLS serving key (the
// key the members already trust to end their tunnels), under a context
// string no TLS signature can begin with. The chain travels in band
// (Certs), so a member that was offline when the key was renewed still
// verifies.
//
// This package imports nothing of the project and no bbolt: the gateway
// links it.
package feed

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Version is the feed's statement version.
const Version = 2

// Statement kinds.
const (
	KindAttest = "attest"
	KindMark   = "mark"
)

// MarkEvery is how often a gateway replica signs a mark while its watches
// are synced.
const MarkEvery = 5 * time.Second

// context is prepended to a header before it is signed: TLS 1.3 signs
// 64 spaces first, TLS 1.2 a client random then a server random; no
// statement can be taken for either, nor either for a statement.
const context = "tether pool feed v2\x00"

// Header is a signed statement.
type Header struct {
	V    int    `json:"v"`
	Kind string `json:"kind"`
	// Feed names the gateway replica that signed it (its host name).
	Feed string `json:"feed"`
	// T is the gateway's clock when it signed.
	T time.Time `json:"t"`
	// Attestation: the resource, the resourceVersion the state is at and
	// its root.
	Resource string `json:"resource,omitempty"`
	To       uint64 `json:"to,omitempty"`
	Root     Hash   `json:"root,omitzero"`
	// Mark: every resource's point.
	Resources map[string]Point `json:"resources,omitempty"`
}

// Point is a resource's position: its resourceVersion and root.
type Point struct {
	To   uint64 `json:"to"`
	Root Hash   `json:"root"`
}

// Signed is a signed header as it travels: the header's JSON (H), its
// signature (S) and the id of the key that made it (K, KeyID).
type Signed struct {
	H []byte `json:"h"`
	S []byte `json:"s"`
	K string `json:"k"`
}

// IsZero reports whether s holds nothing.
func (s Signed) IsZero() bool { return len(s.H) == 0 }

// KeyID names the key of a leaf certificate: the first 16 hex digits of
// the SHA-256 of its DER.
func KeyID(leafDER []byte) string {
	h := sha256.Sum256(leafDER)
	return hex.EncodeToString(h[:8])
}

// Sign signs h with key, whose certificate chain starts with leafDER.
func Sign(key crypto.Signer, leafDER []byte, h Header) (Signed, error) {
	h.V = Version
	b, err := json.Marshal(h)
	if err != nil {
		return Signed{}, fmt.Errorf("encode %s statement: %w", h.Kind, err)
	}
	msg := append([]byte(context), b...)
	var sig []byte
	switch key.Public().(type) {
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, msg, crypto.Hash(0))
	case *rsa.PublicKey:
		d := sha256.Sum256(msg)
		sig, err = key.Sign(rand.Reader, d[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256})
	default:
		d := sha256.Sum256(msg)
		sig, err = key.Sign(rand.Reader, d[:], crypto.SHA256)
	}
	if err != nil {
		return Signed{}, fmt.Errorf("sign %s statement: %w", h.Kind, err)
	}
	return Signed{H: b, S: sig, K: KeyID(leafDER)}, nil
}

// Errors of Verifier.Open and AddChain, which callers count by reason.
var (
	ErrUnknownKey    = errors.New("pool feed: statement signed by a key no trusted chain carries")
	ErrBadSignature  = errors.New("pool feed: bad signature")
	ErrBadChain      = errors.New("pool feed: certificate chain not trusted")
	ErrBadStatement  = errors.New("pool feed: malformed statement")
	errNoTrustConfig = errors.New("pool feed: no roots to verify the gateway's chain with")
)

// MaxKeys bounds the keys a Verifier keeps (every replica's, across
// renewals); past it the one that expires first goes.
const MaxKeys = 16

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	// Roots returns the CAs the gateways' serving certificates chain to
	// (the edge's --gateway-ca; nil: the system's).
	Roots func() *x509.CertPool
	// Names are the names a gateway's certificate may be for (the edge's
	// --gateway-server-name, or its --gateway host names); one must match.
	Names []string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Verifier checks signed statements against gateway certificate chains
// it was given and trusts. Safe for concurrent use.
type Verifier struct {
	o  VerifierOptions
	mu sync.Mutex
	// keys are the trusted keys by KeyID, with their leaf's NotAfter.
	keys map[string]trustedKey
}

type trustedKey struct {
	pub      crypto.PublicKey
	notAfter time.Time
	chain    [][]byte
}

// NewVerifier returns a Verifier.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	if len(o.Names) == 0 {
		return nil, errors.New("pool feed verifier: no gateway name to verify certificates for")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Verifier{o: o, keys: map[string]trustedKey{}}, nil
}

// AddChain verifies a gateway's certificate chain (DER, leaf first) for
// server authentication under one of the names, and trusts its leaf's key
// until the leaf expires. A chain already trusted costs a map lookup.
func (v *Verifier) AddChain(chain [][]byte) error {
	if len(chain) == 0 || len(chain) > 8 {
		return fmt.Errorf("%w: %d certificates", ErrBadChain, len(chain))
	}
	id := KeyID(chain[0])
	v.mu.Lock()
	k, ok := v.keys[id]
	v.mu.Unlock()
	now := v.o.Now()
	if ok && now.Before(k.notAfter) {
		return nil
	}
	certs := make([]*x509.Certificate, len(chain))
	for i, der := range chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadChain, err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	var roots *x509.CertPool
	if v.o.Roots != nil {
		roots = v.o.Roots()
	}
	var lastErr error = errNoTrustConfig
	for _, name := range v.o.Names {
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name,
			CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err == nil {
			lastErr = nil
			break
		}
		lastErr = err
	}
	if lastErr != nil {
		return fmt.Errorf("%w: %v", ErrBadChain, lastErr)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.keys) >= MaxKeys {
		oldest := ""
		for id, k := range v.keys {
			if oldest == "" || k.notAfter.Before(v.keys[oldest].notAfter) {
				oldest = id
			}
		}
		delete(v.keys, oldest)
	}
	v.keys[id] = trustedKey{pub: certs[0].PublicKey, notAfter: certs[0].NotAfter, chain: slices.Clone(chain)}
	return nil
}

// Chains returns the trusted chains, to hand on to followers.
func (v *Verifier) Chains() [][][]byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([][][]byte, 0, len(v.keys))
	for _, id := range sortedKeys(v.keys) {
		out = append(out, v.keys[id].chain)
	}
	return out
}

// Open checks s's signature with a trusted key and returns its header.
func (v *Verifier) Open(s Signed) (Header, error) {
	v.mu.Lock()
	k, ok := v.keys[s.K]
	v.mu.Unlock()
	if !ok {
		return Header{}, fmt.Errorf("%w: key %q", ErrUnknownKey, s.K)
	}
	msg := append([]byte(context), s.H...)
	if !verify(k.pub, msg, s.S) {
		return Header{}, ErrBadSignature
	}
	var h Header
	if err := json.Unmarshal(s.H, &h); err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrBadStatement, err)
	}
	if h.V != Version {
		return Header{}, fmt.Errorf("%w: version %d", ErrBadStatement, h.V)
	}
	switch h.Kind {
	case KindAttest:
		if h.Resource == "" {
			return Header{}, fmt.Errorf("%w: attestation of no resource", ErrBadStatement)
		}
	case KindMark:
	default:
		return Header{}, fmt.Errorf("%w: kind %q", ErrBadStatement, h.Kind)
	}
	return h, nil
}

// OpenKind is Open for a statement that must be of kind: another kind is
// an ErrBadStatement.
func (v *Verifier) OpenKind(s Signed, kind string) (Header, error) {
	h, err := v.Open(s)
	if err == nil && h.Kind != kind {
		return Header{}, fmt.Errorf("%w: a %s statement where a %s was due", ErrBadStatement, h.Kind, kind)
	}
	return h, err
}

func verify(pub crypto.PublicKey, msg, sig []byte) bool {
	switch pub := pub.(type) {
	case ed25519.PublicKey:
		return ed25519.Verify(pub, msg, sig)
	case *ecdsa.PublicKey:
		d := sha256.Sum256(msg)
		return ecdsa.VerifyASN1(pub, d[:], sig)
	case *rsa.PublicKey:
		d := sha256.Sum256(msg)
		return rsa.VerifyPSS(pub, crypto.SHA256, d[:], sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}) == nil
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
