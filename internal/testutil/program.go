package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// Program is the path of the first of names found on PATH. Without any of
// them the test is skipped, except in CI (CI=true), where .ci/run installs
// them: there it fails.
func Program(t testing.TB, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed (.ci/run installs it)", names[0])
	}
	t.Skipf("%s is not installed", names[0])
	return ""
}
