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

	"throttler/internal/testutil"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	dir  string
	aof  bool
	// extra arguments for redis-server (a cluster node's)
	extra []string
	cmd   *exec.Cmd
	t     testing.TB
}

// Start runs redis-server on a free loopback port with its data in a
// temporary directory; with aof, every write is appended to the file
// before it is acknowledged and fsynced each second (appendonly yes,
// appendfsync everysec, as README advises), so a kill -9 of the server
// keeps what was acknowledged. It stops when the test ends.
func Start(t testing.TB, aof bool) *Server {
	t.Helper()
	bin := testutil.Program(t, "redis-server")
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
	s.cmd = exec.Command(bin, append(args, s.extra...)...)
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

// Cluster is a Redis Cluster of masters on loopback ports, no replicas.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs n redis-server processes in cluster mode and joins them
// with redis-cli --cluster create. Without redis-cli, tests skip (or fail
// when CI=true).
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin, cli := testutil.Program(t, "redis-server"), testutil.Program(t, "redis-cli")
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for range n {
		s := &Server{dir: t.TempDir(), t: t, Addr: clusterAddr(t),
			extra: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}}
		s.start(bin)
		t.Cleanup(s.Kill)
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		for {
			out, _ := exec.Command(cli, "-h", "127.0.0.1", "-p", port(s.Addr), "cluster", "info").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster did not come up: %s", out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// URL is the cluster's URL for go-redis (ParseClusterURL).
func (c *Cluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr
	for i, s := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + s.Addr
	}
	return u
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// clusterAddr is a free loopback port whose cluster bus port (+10000) is
// free too.
func clusterAddr(t testing.TB) string {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().(*net.TCPAddr)
		if addr.Port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", addr.Port+10000))
		l.Close()
		if err == nil {
			bus.Close()
			return addr.String()
		}
	}
	t.Fatal("no free port pair for a cluster node")
	return ""
}
