// Package redistest runs a real redis-server for tests: its own process on
// a free loopback port (never the shared one on 6379), so a test can kill
// and restart it. Without redis-server installed, tests skip, or fail when
// CI=true.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	dir  string
	aof  bool
	cmd  *exec.Cmd
	t    testing.TB
}

// Start runs redis-server on a free loopback port with its data in a
// temporary directory; with aof, every write is appended and fsynced each
// second (appendonly yes), so a restart keeps what was acknowledged. It
// stops when the test ends.
func Start(t testing.TB, aof bool) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed (.ci/run installs it)")
		}
		t.Skip("redis-server is not installed")
	}
	s := &Server{dir: t.TempDir(), aof: aof, t: t}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	l.Close()
	s.start(bin)
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start(bin string) {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--dir", s.dir, "--save", "", "--protected-mode", "yes", "--logfile", filepath.Join(s.dir, "redis.log")}
	if s.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	}
	s.cmd = exec.Command(bin, args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on %s did not start:\n%s", s.Addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts the server again on the same port and data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin, _ := exec.LookPath("redis-server")
	s.start(bin)
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// ping speaks just enough RESP to see the server answer.
func ping(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redis answered %q", line)
	}
	return nil
}
