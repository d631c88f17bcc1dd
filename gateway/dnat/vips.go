package dnat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/netrules/vip"
)

// Link holds addresses on the host; *vip.Link is the real one.
type Link interface {
	Sync(addrs []netip.Addr) error
	Delete() error
}

var _ Link = vip.Link{}

// NodePatcher records a VIP on a Node; the real one patches the annotation
// through the API.
type NodePatcher interface {
	SetVIP(ctx context.Context, node string, addr netip.Addr) error
}

// VIPs assigns every edge node a virtual address from a CIDR, records it
// on the Node (annotation tether.io/vip) and holds the assigned addresses
// on the host's tether0 link. Assignment is deterministic (vip.Assign), so
// replicas that race agree; the annotation makes it stable afterwards.
type VIPs struct {
	CIDR    netip.Prefix
	Link    Link
	Patcher NodePatcher
	Logger  *slog.Logger
}

// Sync records missing or changed VIPs and puts the recorded ones of s on
// the link. A VIP the snapshot does not route to its node (nodewatch.Resolve
// refused it) is replaced. Snapshots lag the patches: an address appears on the link (and
// in the rules) once its annotation comes back through the watcher.
func (v *VIPs) Sync(ctx context.Context, s *nodewatch.Snapshot) error {
	var nodes []string
	recorded := map[string]netip.Addr{}
	var held []netip.Addr
	routes := s.Routing(nodewatch.ModeVIP)
	for _, name := range slices.Sorted(maps.Keys(s.Nodes)) {
		n := s.Nodes[name]
		if !n.Edge {
			continue
		}
		nodes = append(nodes, name)
		// Only a VIP the snapshot routes to the node counts as recorded: one
		// the node shares with another (a forged annotation, or a race the
		// node did not win first) or that lies outside the CIDR is assigned
		// anew, and the new address overwrites the annotation.
		if vips := routes.Of(name); len(vips) > 0 {
			recorded[name] = vips[0]
		}
	}
	want, assignErr := vip.Assign(v.CIDR, nodes, recorded)
	var errs []error
	if assignErr != nil {
		errs = append(errs, assignErr)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		addr := want[name]
		if recorded[name] == addr {
			held = append(held, addr)
			continue
		}
		if err := v.Patcher.SetVIP(ctx, name, addr); err != nil {
			errs = append(errs, fmt.Errorf("record VIP %s on node %s: %w", addr, name, err))
			continue
		}
		v.logger().Info("assigned virtual address", "node", name, "vip", addr)
	}
	if err := v.Link.Sync(held); err != nil {
		errs = append(errs, fmt.Errorf("hold VIPs on the link: %w", err))
	}
	return errors.Join(errs...)
}

// Cleanup removes the link and its addresses.
func (v *VIPs) Cleanup() error { return v.Link.Delete() }

func (v *VIPs) logger() *slog.Logger {
	if v.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return v.Logger
}

// APIPatcher records VIPs with a merge patch of the Node's annotations.
type APIPatcher struct{ Client kubernetes.Interface }

func (p APIPatcher) SetVIP(ctx context.Context, node string, addr netip.Addr) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, vip.Annotation, addr.String())
	_, err := p.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "tether-gateway"})
	return err
}
