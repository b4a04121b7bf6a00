package asynqhandler_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/handler/asynqhandler"
)

// Each asynq option with a throttler meaning becomes the job's field; of
// ProcessAt and ProcessIn the last one holds, as under asynq.
func TestJobMapsEachOption(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 8, 9, 0, 0, 0, time.UTC)
	deadline := at.Add(time.Hour)
	task := asynq.NewTask("email:welcome", []byte(`{"to":"a@example.com"}`))
	for _, c := range []struct {
		name string
		opts []asynq.Option
		want client.Job
	}{
		{"none", nil, client.Job{}},
		{"ProcessAt", []asynq.Option{asynq.ProcessAt(at)}, client.Job{NotBefore: at}},
		{"ProcessIn", []asynq.Option{asynq.ProcessIn(30 * time.Minute)}, client.Job{Delay: 30 * time.Minute}},
		{"ProcessIn after ProcessAt", []asynq.Option{asynq.ProcessAt(at), asynq.ProcessIn(time.Hour)}, client.Job{Delay: time.Hour}},
		{"ProcessAt after ProcessIn", []asynq.Option{asynq.ProcessIn(time.Hour), asynq.ProcessAt(at)}, client.Job{NotBefore: at}},
		{"ProcessIn in the past", []asynq.Option{asynq.ProcessIn(-time.Minute)}, client.Job{}},
		{"Deadline", []asynq.Option{asynq.Deadline(deadline)}, client.Job{Deadline: deadline}},
		{"TaskID", []asynq.Option{asynq.TaskID("welcome-42")}, client.Job{IdempotencyKey: "welcome-42"}},
		{"all", []asynq.Option{asynq.TaskID("k"), asynq.ProcessAt(at), asynq.Deadline(deadline)}, client.Job{IdempotencyKey: "k", NotBefore: at, Deadline: deadline}},
	} {
		job, err := asynqhandler.Job(task, c.opts...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		c.want.Type, c.want.Payload = "email:welcome", json.RawMessage(`{"to":"a@example.com"}`)
		got, _ := json.Marshal(job)
		want, _ := json.Marshal(c.want)
		if string(got) != string(want) || !job.NotBefore.Equal(c.want.NotBefore) || job.Delay != c.want.Delay {
			t.Errorf("%s: %s, want %s", c.name, got, want)
		}
	}
	job, _ := asynqhandler.Job(task, asynq.ProcessIn(90*time.Minute), asynq.Deadline(deadline))
	if raw, _ := json.Marshal(job); !strings.Contains(string(raw), `"delay":"1h30m0s"`) || !strings.Contains(string(raw), `"deadline":"2026-12-08T10:00:00Z"`) {
		t.Errorf("on the wire: %s", raw)
	}
}

// Every option with no throttler meaning is refused, each named with the
// setting that does its work; so are payloads that would not reach the
// handler as the same bytes, a task with headers or options of its own,
// and a type or task id the API would refuse.
func TestJobRefusesWhatDoesNotCarryOver(t *testing.T) {
	t.Parallel()
	ok := []byte(`{"a":1}`)
	for _, c := range []struct {
		name string
		task *asynq.Task
		opts []asynq.Option
		says []string
	}{
		{"Queue", asynq.NewTask("t", ok), []asynq.Option{asynq.Queue("critical")}, []string{`Queue("critical")`, "tenant"}},
		{"MaxRetry", asynq.NewTask("t", ok), []asynq.Option{asynq.MaxRetry(3)}, []string{"MaxRetry(3)", "max_attempts"}},
		{"Timeout", asynq.NewTask("t", ok), []asynq.Option{asynq.Timeout(time.Minute)}, []string{"Timeout(1m0s)", "downstream's timeout"}},
		{"Unique", asynq.NewTask("t", ok), []asynq.Option{asynq.Unique(time.Hour)}, []string{"Unique(1h0m0s)", "TaskID", "idempotency key"}},
		{"Retention", asynq.NewTask("t", ok), []asynq.Option{asynq.Retention(time.Hour)}, []string{"Retention(1h0m0s)", "store.retention"}},
		{"Group", asynq.NewTask("t", ok), []asynq.Option{asynq.Group("g")}, []string{`Group("g")`, "aggregate"}},
		{"each named", asynq.NewTask("t", ok), []asynq.Option{asynq.Queue("q"), asynq.ProcessIn(time.Minute), asynq.MaxRetry(1)}, []string{`Queue("q")`, "MaxRetry(1)"}},
		{"no payload", asynq.NewTask("t", nil), nil, []string{"no payload"}},
		{"null payload", asynq.NewTask("t", []byte("null")), nil, []string{"null"}},
		{"not JSON", asynq.NewTask("t", []byte{0x0a, 0x03, 'a', 'b', 'c'}), nil, []string{"not JSON", "base64"}},
		{"not UTF-8", asynq.NewTask("t", []byte("\"\xff\"")), nil, []string{"not JSON (UTF-8)"}},
		{"not compact", asynq.NewTask("t", []byte(`{"a": 1}`)), nil, []string{"compact", "other bytes"}},
		{"HTML unescaped", asynq.NewTask("t", []byte(`{"a":"<b>"}`)), nil, []string{"json.HTMLEscape"}},
		{"headers", asynq.NewTaskWithHeaders("t", ok, map[string]string{"trace": "1"}), nil, []string{"headers"}},
		{"options of the task", asynq.NewTask("t", ok, asynq.MaxRetry(3)), nil, []string{"made with 1 option(s)", "give them to Job"}},
		{"no type", asynq.NewTask("", ok), nil, []string{"printable ASCII"}},
		{"type not ASCII", asynq.NewTask("e-mail:bienvenue:é", ok), nil, []string{"printable ASCII"}},
		{"task id not ASCII", asynq.NewTask("t", ok), []asynq.Option{asynq.TaskID("clé")}, []string{"idempotency key"}},
	} {
		_, err := asynqhandler.Job(c.task, c.opts...)
		if err == nil {
			t.Errorf("%s: taken", c.name)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", c.name, err, s)
			}
		}
	}
	if _, err := asynqhandler.Job(nil); err == nil {
		t.Error("a nil task: taken")
	}
}

// A job made by Job from a task and sent by the client reaches the asynq
// handler as a task of the same type with the same payload bytes (here
// json.Marshal's, with its escapes), once for its task id.
func TestJobReachesTheHandlerAsTheTask(t *testing.T) {
	t.Parallel()
	payload, _ := json.Marshal(map[string]string{"to": "a@example.com", "html": "<b>Welcome</b> & more"})
	got := make(chan *asynq.Task, 2)
	mux := asynq.NewServeMux()
	mux.HandleFunc("email:welcome", func(_ context.Context, task *asynq.Task) error { got <- task; return nil })
	hm := handler.NewMux()
	hm.Handle("tasks", asynqhandler.New(mux))
	base := start(t, `
[downstreams.tasks]
handler = "tasks"
[tenant_defaults]
downstream = "tasks"
rate = "50/s"
`, hm)
	c, err := client.New(base)
	if err != nil {
		t.Fatal(err)
	}
	job, err := asynqhandler.Job(asynq.NewTask("email:welcome", payload), asynq.TaskID("welcome-1"), asynq.Deadline(time.Now().Add(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		if a, err := c.Enqueue(ctx, "acme", job); err != nil || a.Repeated != (i == 1) {
			t.Fatalf("enqueue %d: %+v %v", i, a, err)
		}
	}
	select {
	case task := <-got:
		if task.Type() != "email:welcome" || string(task.Payload()) != string(payload) {
			t.Fatalf("the handler got %q %s, want %q %s", task.Type(), task.Payload(), "email:welcome", payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler got nothing")
	}
	nothingMoreWithin(200 * time.Millisecond)
	if len(got) != 0 {
		t.Fatal("the task id's repeat was handled too")
	}
}

// nothingMoreWithin lets d pass so that the check after it can show that
// nothing more happened meanwhile: absence has no condition to wait for.
func nothingMoreWithin(d time.Duration) { time.Sleep(d) }
