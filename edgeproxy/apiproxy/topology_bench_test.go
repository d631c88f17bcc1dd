package apiproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/edgeproxy/filter"
)

// benchState is an in-memory filter state: 10 pools of 10 nodes.
type benchState struct{ keys string }

func (s benchState) TopologyKeys(string, string) (string, bool) { return s.keys, true }
func (benchState) PoolOf(node string) string                    { return "p" + node[len(node)-1:] }

type benchTopology struct{ filter.Topology }

func (benchTopology) WaitSynced(context.Context, time.Duration) bool { return true }
func (benchTopology) Subscribe() (<-chan filter.Change, func())      { return nil, func() {} }

// BenchmarkFilterEvent is the cost the topology filter adds to one watch
// event of an EndpointSlice with 100 endpoints: decode, filter, encode,
// as relayed to the client (not counting the cache copy every cached
// event has).
func BenchmarkFilterEvent(b *testing.B) {
	s := &discoveryv1.EndpointSlice{TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "svc-abc", Namespace: "ns", ResourceVersion: "100",
			Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Port: ptr.To[int32](80)}}}
	for i := range 100 {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)},
			NodeName: ptr.To(fmt.Sprintf("node-%d", i)), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	var pb bytes.Buffer
	if err := protobuf.Serializer.Encode(s, &pb); err != nil {
		b.Fatal(err)
	}
	pev, _ := (&metav1.WatchEvent{Type: "MODIFIED", Object: runtime.RawExtension{Raw: pb.Bytes()}}).Marshal()
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(pev)))
	frame = append(frame, pev...)
	js, _ := json.Marshal(s)
	jev, _ := json.Marshal(watchEvent{Type: "MODIFIED", Object: js})

	for _, keys := range []string{filter.KeyHostname, filter.KeyNodePool, "kubernetes.io/hostname,openyurt.io/nodepool,*"} {
		for _, c := range []struct {
			name  string
			proto bool
			ev    []byte
		}{{"protobuf", true, frame}, {"json", false, jev}} {
			b.Run(fmt.Sprintf("keys=%s/%s", keys, c.name), func(b *testing.B) {
				st := benchState{keys: keys}
				p := &Proxy{topo: benchTopology{filter.Topology{Node: "node-7", Services: st, Pools: st}}, log: slog.New(slog.DiscardHandler)}
				tw := &topoWatch{p: p, filter: p.topo, gvr: endpointSlicesGVR, codec: objCodec{proto: c.proto}, sent: map[string]uint64{},
					write: func(ev []byte) error { _, err := io.Discard.Write(ev); return err }}
				b.ReportAllocs()
				b.SetBytes(int64(len(c.ev)))
				for b.Loop() {
					if _, err := tw.filterEvent(c.ev); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
