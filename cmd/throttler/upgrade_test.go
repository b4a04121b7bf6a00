package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// upgradeFrom is the build before the embedded store's index of waiting
// jobs held their places (it held their tenants alone, and a restart read
// every job's record): a store it wrote must open in this build.
const upgradeFrom = "224eb88"

// upgradeTenants are two tenants at different rates (upgradeT), so that
// each is held to its own interval after the upgrade, not one shared one.
const upgradeTenants = "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 100\n[tenants.t1]\nrate = \"10/s\"\n"

var upgradeT = map[string]time.Duration{"t0": 50 * time.Millisecond, "t1": 100 * time.Millisecond}

// upgradePerTenant jobs are posted to each tenant at once: 0.75 s of t0's
// sends and 1.5 s of t1's, so most still wait at the kill.
const upgradePerTenant = 15

// A store written by the build before (upgradeFrom), with jobs
// waiting and one attempt under way when that build is killed with
// SIGKILL, is opened by this build: every job arrives (at least once; a
// repeat only of an attempt the kill cut, with its key and payload), and
// each tenant's arrivals, of both builds together, keep its interval.
// Embedded: the bbolt file (and its write-ahead log) the old process left.
// Redis (AOF on): the keys it left, its leases lapsing before this build
// takes its partitions over.
func TestUpgradeFromPreviousBuild(t *testing.T) {
	testutil.SkipShort(t, "process test: builds the previous release from git history, kills it and starts this build on its store")
	skipUnderRace(t)
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	old := previousBinary(t)
	t.Run("Embedded", func(t *testing.T) {
		t.Parallel()
		ds := downstreamtest.New(t)
		upgradeAfterKill9(t, old, ds, writeConfig(t, upgradeTenants, ds))
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, true)
		ds := downstreamtest.New(t)
		upgradeAfterKill9(t, old, ds, redisConfig(t, srv.URL(), "standalone", upgradeTenants, ds))
	})
}

// upgradeAfterKill9 runs the previous build on file, posts the jobs, kills
// it while the downstream holds t0's fourth request open and t1 has
// begun, starts this build on the same file (and store), and checks what
// arrives.
func upgradeAfterKill9(t *testing.T, old string, ds *downstreamtest.Server, file string) {
	throttlerBinary(t) // built now, so that this build starts at once after the kill
	began := time.Now()
	// The downstream holds t0's fourth request open, so that the kill cuts
	// an attempt: the previous build's record of a job being sent is what
	// this build must send again.
	t0 := 0
	inAttempt, carriedOut := stallFirst(t, ds, func(r *http.Request, _ string) bool {
		if r.Header.Get("X-Throttler-Tenant") == "t0" {
			t0++
		}
		return t0 == 4
	})
	p := startCommand(t, exec.Command(old, "serve", "--config", file))
	names := postAtOnce(t, p.base, len(upgradeT), upgradePerTenant)
	stalled := awaitStalled(t, inAttempt)
	testutil.WaitFor(t, 10*time.Second, "t1's first sends by the previous build", func() bool { return len(ds.Of("t1")) >= 3 })
	p.kill9(t)
	before := len(ds.All())
	// Every arrival stamped before this was sent by the previous build
	// (dead by now), every one after it by this build.
	restarted := time.Now()
	p = startProcess(t, file)
	listening := time.Since(restarted)

	all, _ := awaitEveryKey(t, ds, names, upgradeT["t1"])
	repeats := checkRepeatsAtTheKill(t, ds, names, stalled, restarted)
	ids := make([]string, 0, len(names))
	for id := range names {
		ids = append(ids, id)
	}
	checkCarriedOutOnce(t, carriedOut(), ids)
	closest := map[string]time.Duration{}
	for tenant, T := range upgradeT {
		of := ds.Of(tenant)
		downstreamtest.CheckWindows(t, of, T, 1)
		closest[tenant] = time.Hour
		for i := 1; i < len(of); i++ {
			closest[tenant] = min(closest[tenant], of[i].At.Sub(of[i-1].At))
		}
	}
	checkUpgradedStore(t, p.base, ids)

	var first time.Duration
	for _, a := range all {
		if a.At.After(restarted) {
			first = a.At.Sub(restarted)
			break
		}
	}
	t.Logf("%d jobs; %d arrivals from %s before the kill, %d from this build after; repeats (the attempts the kill cut, same key) %v; "+
		"this build listening %v after the kill, its first send %v after it; closest pair t0 %v (T 50ms), t1 %v (T 100ms); closest across the kill %v; %v in all",
		len(names), before, upgradeFrom, len(all)-before, repeats, listening.Round(time.Millisecond), first.Round(time.Millisecond),
		closest["t0"].Round(10*time.Microsecond), closest["t1"].Round(10*time.Microsecond),
		closestAcross(ds, len(upgradeT), []time.Time{restarted}).Round(10*time.Microsecond), time.Since(began).Round(100*time.Millisecond))
}

// outcomeLag bounds how long before a kill a job can have been sent whose
// outcome the kill still cut: outcomes are written in batches right behind
// the sends (the embedded store's group commit, a Redis script), and the
// other kill tests see repeats only of jobs sent in the second before the
// kill (docs/RELIABILITY.md).
const outcomeLag = time.Second

// checkRepeatsAtTheKill fails t unless every job arrived exactly once, but
// for the attempts the kill cut (DESIGN.md invariant 4: delivery at least
// once, a repeat with the same Idempotency-Key): the one the downstream
// held open (stalled) must, and one whose outcome the previous build had
// not written yet may, arrive twice, first from the previous build before
// restarted and again from this build after it; the latter first sent at
// most outcomeLag before the kill. It returns the repeated jobs' keys, each
// with how long before the kill it was first sent.
func checkRepeatsAtTheKill(t *testing.T, ds *downstreamtest.Server, names map[string]string, stalled string, restarted time.Time) []string {
	t.Helper()
	at := map[string][]time.Time{}
	for _, a := range ds.All() {
		at[a.Key] = append(at[a.Key], a.At)
	}
	if n := len(at[stalled]); n != 2 {
		t.Fatalf("the job in flight at the kill (%s) arrived %d times, want twice (same Idempotency-Key)", names[stalled], n)
	}
	var repeats []string
	for key, times := range at {
		if len(times) == 1 {
			continue
		}
		before := restarted.Sub(times[0])
		if len(times) > 2 || before < 0 || times[1].Before(restarted) || (key != stalled && before > outcomeLag) {
			t.Fatalf("%s arrived at %v (this build started at %v): only an attempt the kill cut may repeat, once, after it, "+
				"and one that was answered only if sent within %v before the kill", names[key], times, restarted, outcomeLag)
		}
		repeats = append(repeats, fmt.Sprintf("%s (%v before)", names[key], before.Round(time.Millisecond)))
	}
	slices.Sort(repeats)
	return repeats
}

// checkUpgradedStore fails t unless this build, on the store the previous
// build wrote, shows every job succeeded (those the previous build sent
// too: their outcomes are its records) and each tenant's queue empty with
// every job it accepted counted.
func checkUpgradedStore(t *testing.T, base string, ids []string) {
	t.Helper()
	waitAllSucceeded(t, base, ids, 10*time.Second)
	for tenant := range upgradeT {
		_, _, ten := call(t, "GET", base+"/v1/tenants/"+tenant, "")
		if ten["queue_depth"] != 0.0 || ten["accepted_total"] != float64(upgradePerTenant) {
			t.Fatalf("tenant %s after the upgrade: %v, want queue_depth 0, accepted_total %d", tenant, ten, upgradePerTenant)
		}
	}
}

var (
	previousOnce sync.Once
	previousDir  string // holds the previous build's binary; TestMain removes it
	previousBin  string
	previousErr  error
)

// previousBinary is cmd/throttler built from commit upgradeFrom of this
// repository's history, once per test run. Without that commit (a shallow
// clone, a tree exported without .git) the test is skipped, saying why;
// but not in CI (CI=true), where it fails: .ci/run runs on a fresh clone,
// which has the whole history, so there a missing commit is a broken
// setup, as a missing program is (testutil.Program).
func previousBinary(t *testing.T) string {
	t.Helper()
	git, tar := testutil.Program(t, "git"), testutil.Program(t, "tar")
	commit, why := resolvePrevious(git)
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(why + "; CI's clone is to have the whole history")
		}
		t.Skip(why)
	}
	previousOnce.Do(func() { previousBin, previousErr = buildPrevious(git, tar, commit) })
	if previousErr != nil {
		t.Fatal(previousErr)
	}
	return previousBin
}

// resolvePrevious is upgradeFrom's full hash, or why it cannot be had.
func resolvePrevious(git string) (commit, why string) {
	out, err := exec.Command(git, "rev-parse", "--verify", "--quiet", upgradeFrom+"^{commit}").Output()
	if err == nil {
		return strings.TrimSpace(string(out)), ""
	}
	why = fmt.Sprintf("the upgrade test needs commit %s (the build before this one), which this checkout lacks", upgradeFrom)
	switch shallow, err := exec.Command(git, "rev-parse", "--is-shallow-repository").Output(); {
	case err != nil:
		why += ": not a git repository"
	case strings.TrimSpace(string(shallow)) == "true":
		why += ": a shallow clone (git fetch --unshallow brings the history)"
	}
	return "", why
}

// buildPrevious builds commit's cmd/throttler. The build uses the module
// cache as this one does: the two commits' go.sum are the same, so nothing
// is downloaded.
func buildPrevious(git, tar, commit string) (string, error) {
	src, err := previousSource(git, tar, commit)
	if err != nil {
		return "", err
	}
	if previousDir, err = os.MkdirTemp("", "throttler-previous-"); err != nil {
		return "", err
	}
	bin := filepath.Join(previousDir, "throttler")
	// No VCS stamp: the tree has no .git, and a repository around the
	// cache directory (a home under git) is not this one.
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./cmd/throttler")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of %s: %v\n%s", commit, err, out)
	}
	return bin, nil
}

// previousSource is commit's tree, exported with git archive (the
// checkout and its worktrees are left alone) into the user's cache
// directory, and kept there: the build cache keys a package by its
// directory, so a tree at the same path every run has its packages
// compiled once, and later builds only link (seconds, not a minute). It is
// extracted beside its place and renamed into it, so a test run beside
// this one finds it whole or not at all.
func previousSource(git, tar, commit string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "throttler-test", "src-"+commit)
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "extract-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// From the top: git archive run in a subdirectory exports only that.
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse --show-toplevel: %v", err)
	}
	archive, tree := filepath.Join(tmp, "src.tar"), filepath.Join(tmp, "src")
	if out, err := exec.Command(git, "-C", strings.TrimSpace(string(top)), "archive", "--output", archive, commit).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.Mkdir(tree, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command(tar, "-xf", archive, "-C", tree).CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar -x: %v\n%s", err, out)
	}
	if err := os.Rename(tree, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "go.mod")); serr != nil {
			return "", err
		}
		// Another run put it there first: the same tree.
	}
	return dir, nil
}
