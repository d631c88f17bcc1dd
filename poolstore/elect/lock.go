package elect

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/poolstore/record"
)

// The election record is a ConfigMap that nodes only read; a
// record.Writer writes it (package record says why).

// recordLock reads the election record in the ConfigMap
// record.Namespace/record.ElectionName(pool) and has it written.
type recordLock struct {
	get  record.ConfigMapGetter
	w    record.Writer
	pool string
	name string
	cm   *corev1.ConfigMap // as last read or written: the next update's base
}

func (l *recordLock) String() string { return record.Namespace + "/" + l.name }

// read reads the record, and its annotation as read (the elector compares
// it with the last one to see a change).
func (l *recordLock) read(ctx context.Context) (record.Election, []byte, error) {
	cm, err := l.get.Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return record.Election{}, nil, err
	}
	l.cm = cm
	rec, err := record.DecodeElection(cm)
	if err != nil {
		return record.Election{}, nil, fmt.Errorf("election record %s: %w", l, err)
	}
	return rec, []byte(cm.Annotations[record.ElectionAnnotation]), nil
}

func (l *recordLock) create(ctx context.Context, rec record.Election) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: record.Namespace}}
	if err := record.SetElection(cm, rec); err != nil {
		return err
	}
	cm, err := l.w.WriteRecord(ctx, record.Write{Kind: record.KindElection, Pool: l.pool, Create: true, ConfigMap: cm})
	if err != nil {
		return err
	}
	l.cm = cm
	return nil
}

// update writes rec on the ConfigMap as last read or written.
func (l *recordLock) update(ctx context.Context, rec record.Election) error {
	if l.cm == nil {
		return errors.New("election record not read before update")
	}
	cm := l.cm.DeepCopy()
	if err := record.SetElection(cm, rec); err != nil {
		return err
	}
	// The update carries the read's resourceVersion: a concurrent
	// writer makes it fail with a conflict, as a Lease update would.
	cm, err := l.w.WriteRecord(ctx, record.Write{Kind: record.KindElection, Pool: l.pool, ConfigMap: cm})
	if err != nil {
		return err
	}
	l.cm = cm
	return nil
}
