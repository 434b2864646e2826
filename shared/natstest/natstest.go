// Package natstest runs an embedded NATS JetStream server per test, in one
// line:
//
//	srv := natstest.New(t)
//	nc, _ := nats.Connect(srv.URL())
//
// The server listens on a random loopback port with a temporary store. It can
// be stopped and restarted on the same port and store, to test what survives
// a broker restart. It is shut down when the test ends.
package natstest

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an embedded JetStream server owned by one test.
type Server struct {
	t     testing.TB
	mu    sync.Mutex
	opts  server.Options
	srv   *server.Server
	url   string
	store string
}

// New starts an embedded JetStream server for t.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, store: t.TempDir()}
	s.opts = server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: s.store, NoLog: true, NoSigs: true}
	if err := s.start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Start runs an embedded JetStream server outside tests (the demo). storeDir
// must exist; port 0 picks a free one.
func Start(storeDir string, port int) (*server.Server, error) {
	if port == 0 {
		port = -1
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: storeDir, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("natstest: embedded server not ready after 10s")
	}
	return srv, nil
}

func (s *Server) start() error {
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		return err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("embedded server not ready after 10s")
	}
	s.srv = srv
	s.url = srv.ClientURL()
	// Pin the port so a restart keeps the same URL and clients reconnect.
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		s.opts.Port = addr.Port
	}
	return nil
}

// URL is the client URL, stable across Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Server returns the running server (nil while stopped).
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Stop shuts the server down and waits for it; the store is kept.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart starts the server again on the same port and store.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly after shutdown
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("natstest: restart: %v", err)
}
