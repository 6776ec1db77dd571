package main

import (
	"encoding/json"
	"os"
	"time"
)

// writeRecords writes what a run recorded to path as JSON, for a person
// looking into a violation: the executions and attempts without their
// bodies, times in seconds after t0 (the first attempt), the faults, and
// what was left in Redis.
func writeRecords(path string, rec runRecord) error {
	t0 := time.Time{}
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			if t0.IsZero() || a.Start.Before(t0) {
				t0 = a.Start
			}
		}
	}
	at := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return t.Sub(t0).Seconds()
	}
	type execOut struct {
		ID, Key        string
		Account        string   `json:",omitempty"`
		Concurrent     []string `json:",omitempty"` // the account's executions in progress when it began
		Node           int
		Fence          int64
		Start, End     float64
		Status         int
		Large, Dropped bool
		Bytes          int
		WriteErr       string `json:",omitempty"`
	}
	type attemptOut struct {
		Key             string
		Client, N, Node int
		Patient         bool
		Start, End      float64
		Status          int
		Err             string `json:",omitempty"`
		Replayed        bool
		Problem, ExecID string `json:",omitempty"`
		RetryAfter      float64
	}
	type faultOut struct {
		Kind                faultKind
		Nodes               []int
		Start, Back, Return float64
		Detail, Err         string
	}
	out := struct {
		Executions []execOut
		Attempts   []attemptOut
		Faults     []faultOut
		End        redisState
	}{End: rec.End}
	for _, e := range rec.Execs {
		out.Executions = append(out.Executions, execOut{ID: e.ID, Key: e.Key, Account: e.Account, Concurrent: e.Concurrent, Node: e.Node, Fence: e.Fence,
			Start: at(e.Start), End: at(e.End), Status: e.Status, Large: e.Large, Dropped: e.Body == nil,
			Bytes: len(e.Body), WriteErr: e.WriteErr})
	}
	for _, c := range rec.Clients {
		for _, a := range c.Attempts {
			out.Attempts = append(out.Attempts, attemptOut{Key: a.Key, Client: a.Client, N: a.N, Node: a.Node,
				Patient: a.Patient, Start: at(a.Start), End: at(a.End), Status: a.Status, Err: a.Err,
				Replayed: a.Replayed, Problem: a.Problem, ExecID: a.ExecID, RetryAfter: a.RetryAfter.Seconds()})
		}
	}
	for _, f := range rec.Faults {
		nodes := f.Nodes
		if nodes == nil {
			nodes = []int{f.Node}
		}
		out.Faults = append(out.Faults, faultOut{Kind: f.Kind, Nodes: nodes, Start: at(f.Start), Back: at(f.Back),
			Return: at(f.Return), Detail: f.Detail, Err: f.Err})
	}
	b, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
