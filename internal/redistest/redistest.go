// Package redistest runs a real redis-server for tests: its own process on
// a free loopback port (never the shared one on 6379), so a test can kill
// and restart it. Without redis-server installed, tests skip, or fail when
// CI=true.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	dir  string
	aof  bool
	// extra arguments for redis-server (a cluster node's)
	extra []string
	cmd   *exec.Cmd
	// exited is closed once cmd's process has exited and been reaped.
	exited <-chan struct{}
	t      testing.TB
}

// Start runs redis-server on a free loopback port with its data in a
// temporary directory; with aof, every write is appended to the file
// before it is acknowledged and fsynced each second (appendonly yes,
// appendfsync everysec, as docs/redis.md advises), so a kill -9 of the server
// keeps what was acknowledged. It stops when the test ends.
//
// A free port is only free until someone binds it: between the probe and
// redis-server's bind, another test (of this package or of another one
// running beside it) can take it. Then redis-server exits, and a PING on
// the port would be answered by the other test's server: two tests would
// share one Redis and see each other's tenants. So the server that
// answers must be the process started here, or another port is tried.
func Start(t testing.TB, aof bool) *Server {
	t.Helper()
	bin := testutil.Program(t, "redis-server")
	s := &Server{dir: t.TempDir(), aof: aof, t: t}
	t.Cleanup(s.Kill)
	for try := 1; ; try++ {
		s.Addr = freeAddr(t)
		err := s.start(bin)
		if err == nil {
			return s
		}
		if try == 5 {
			t.Fatal(err)
		}
		t.Logf("redis-server did not get %s (%v); another port", s.Addr, err)
	}
}

// freeAddr is a loopback address with a port free at the time of asking.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs redis-server on s.Addr and waits until it answers there as
// the process it started. An error says it did not (the port was taken).
func (s *Server) start(bin string) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--dir", s.dir, "--save", "", "--protected-mode", "yes", "--logfile", filepath.Join(s.dir, "redis.log")}
	if s.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	}
	cmd := exec.Command(bin, append(args, s.extra...)...)
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited:\n%s", s.Addr, lastLines(log, 3))
		default:
		}
		pid, err := serverPID(s.Addr)
		switch {
		case err == nil && pid == cmd.Process.Pid:
			return nil
		case err == nil:
			// Another test's server holds the port; ours is about to
			// find out that it cannot bind.
			s.Kill()
			return fmt.Errorf("%s is answered by another redis-server (pid %d)", s.Addr, pid)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on %s did not start:\n%s", s.Addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

// Restart starts the server again on the same port and data. A test that
// restarts its Redis cannot move it to another port; if another test took
// the port meanwhile, it fails (and says so) rather than talk to a Redis
// that is not its own.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin, _ := exec.LookPath("redis-server")
	if err := s.start(bin); err != nil {
		s.t.Fatalf("restart: %v", err)
	}
}

// SeenPartitions makes the server a Redis whose first n partitions have
// had owners that left cleanly (an epoch each, no lease): a worker takes
// them at once instead of holding them vacant for a lease, as it must on a
// Redis that never saw them (owner's acquire.lua). For tests about
// something else than a new Redis.
func (s *Server) SeenPartitions(t testing.TB, n int) {
	t.Helper()
	for p := range n {
		// owner.KeyPrefix(p) + "epoch", spelt out: package owner's own
		// tests use this package, which cannot import it.
		if err := send(s.Addr, "SET", fmt.Sprintf("throttler:{throttler-p%d}:epoch", p), "1", "NX"); err != nil {
			t.Fatal(err)
		}
	}
}

// send sends one command and reads a one-line answer (enough for SET).
func send(addr string, args ...string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	cmd := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		cmd += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(cmd)); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.HasPrefix(line, "-") {
		return fmt.Errorf("redis: %s", strings.TrimSpace(line))
	}
	return nil
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// serverPID asks the server on addr for its process id (INFO server),
// speaking just enough RESP for that.
func serverPID(addr string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil {
		return 0, fmt.Errorf("redis answered %q", head) // -LOADING while it reads its AOF
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no process_id in INFO server")
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
		if err := s.start(bin); err != nil {
			t.Fatal(err)
		}
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
