package deploy_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy forwards TCP connections to target until Cut, which closes the
// listener and every forwarded connection: to the code behind it the
// database is gone, as when Postgres stops.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				c.Close()
				up.Close()
			} else {
				p.conns = append(p.conns, c, up)
			}
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(p.Cut)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Cut stops forwarding: new connections are refused, open ones drop.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
