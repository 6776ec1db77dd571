package redistest

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestGateShutRefusesOpenForwards(t *testing.T) {
	s := Start(t)
	g := StartGate(t, s.Addr)
	ctx := Context(t, 10*time.Second)
	c, err := Dial(ctx, g.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Do(ctx, "PING"); err != nil || v != "PONG" {
		t.Fatalf("PING through the open gate: %v %v", v, err)
	}
	g.Shut()
	if _, err := c.Do(ctx, "PING"); err == nil {
		t.Fatal("a connection through the gate outlived Shut")
	}
	if conn, err := net.DialTimeout("tcp", g.Addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("the shut gate accepted a connection")
	}
	if err := g.Open(); err != nil {
		t.Fatal(err)
	}
	if v, err := DoString(context.Background(), g.Addr, nil, "PING"); err != nil || v != "PONG" {
		t.Fatalf("PING through the reopened gate: %v %v", v, err)
	}
}
