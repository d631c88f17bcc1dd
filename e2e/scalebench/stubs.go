package main

import "context"

type hbPhase struct{}
type churnResult struct{}
type replicaResult struct{}

func (b *bench) heartbeats(ctx context.Context, res *results) error {
	note("heartbeats: not implemented yet")
	return nil
}
func (b *bench) churn(ctx context.Context, res *results) error {
	note("churn: not implemented yet")
	return nil
}
func (b *bench) replicas(ctx context.Context, res *results) error {
	note("replicas: not implemented yet")
	return nil
}

func printLaterPhases(o options, r *results) {}
func (r *results) hbSummary() (float64, int) { return -1, -1 }
