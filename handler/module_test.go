package handler_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// Another module can require this one and use its public packages
// (DESIGN.md section 6d): a new module in a temporary directory requires
// this module by its path (read from go.mod, so the test holds whatever
// the path is), replaced by this checkout, and builds a program with the
// handler, asynqhandler and client packages. No network: the module cache
// and this checkout's go.sum have everything.
func TestAnotherModuleBuildsWithThePublicPackages(t *testing.T) {
	testutil.SkipShort(t, "builds another module with go build")
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mod := modulePath(t, filepath.Join(root, "go.mod"))
	if first, _, _ := strings.Cut(mod, "/"); !strings.Contains(first, ".") {
		t.Logf("the module path %q builds under a replace, but `go get` cannot fetch it (no dot in its first element): it is to be renamed", mod)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", fmt.Sprintf("module example.com/outside\n\ngo 1.26\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", mod, mod, root))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	write("main.go", strings.ReplaceAll(`package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/hibiken/asynq"

	"MODULE/client"
	"MODULE/handler"
	"MODULE/handler/asynqhandler"
)

func main() {
	tasks := asynq.NewServeMux()
	tasks.HandleFunc("email:welcome", func(ctx context.Context, t *asynq.Task) error { return nil })
	mux := handler.NewMux()
	mux.Handle("tasks", asynqhandler.New(tasks))
	mux.HandleFunc("sms", func(ctx context.Context, job *handler.Job) ([]byte, error) {
		return nil, handler.Pushback(0, nil)
	})
	_, _ = client.New("http://127.0.0.1:8080")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := handler.Run(ctx, handler.Options{ConfigFile: "config.toml", Handlers: mux}); err != nil {
		panic(err)
	}
}
`, "MODULE", mod))
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "outside"), ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a module outside this one does not build with %s: %v\n%s", mod, err, out)
	}
}

// modulePath is the module path that go.mod at file declares.
func modulePath(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(p), `"`)
		}
	}
	t.Fatalf("%s declares no module", file)
	return ""
}
