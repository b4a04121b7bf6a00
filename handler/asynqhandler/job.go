package asynqhandler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/client"
)

// Job turns an asynq task and the options a producer would pass to
// asynq's Client.Enqueue into a throttler job, so that a producer written
// for asynq enqueues through throttler's client instead:
//
//	job, err := asynqhandler.Job(asynq.NewTask("email:welcome", payload), asynq.ProcessIn(time.Hour), asynq.TaskID(id))
//	if err != nil { ... }
//	a, err := c.Enqueue(ctx, tenant, job) // c is a *client.Client
//
// Sent to a tenant whose downstream is a New adapter, the job reaches the
// asynq handler as a task of the same type with the same payload bytes.
// The type is the task's (1 to 256 printable ASCII characters: the API's
// bound on a job's type). The API carries a payload as JSON and the client
// sends it compact, as json.Marshal writes it; so the payload must be a
// JSON value written that way (what json.Marshal gives), and any other
// payload is refused with an error saying so, rather than reaching the
// handler as other bytes: an empty or null payload, bytes that are not
// JSON (protobuf, msgpack: marshal such bytes with json.Marshal, which
// writes a []byte as a base64 string, and unmarshal them in the handler),
// or JSON with spaces between its tokens or with <, > or & unescaped
// (json.Compact and json.HTMLEscape give the form sent).
//
// The options that mean something to throttler become the job's fields:
//
//   - asynq.ProcessAt(t): NotBefore = t (booked at the first slot at or
//     after t that the tenant's limits allow; the Admission says when);
//   - asynq.ProcessIn(d): Delay = d (0 or less: no delay, as under asynq).
//     Of ProcessAt and ProcessIn the last one given holds, as under asynq;
//   - asynq.Deadline(t): Deadline = t. Throttler's deadline is earlier in
//     the job's life than asynq's: a job that could not be sent by then is
//     refused at enqueue (*client.WouldExpireError) or ends expired, never
//     sent after; the time an attempt may take is the downstream's timeout;
//   - asynq.TaskID(id): IdempotencyKey = id (1 to 256 printable ASCII
//     characters). A second job with the key is answered with the first
//     (Admission.Repeated), where asynq refuses it (ErrTaskIDConflict).
//
// Every other option is refused, each named in the error with the
// throttler setting that does its work: asynq.Queue (the tenant, and its
// downstream), MaxRetry (the downstream's or tenant's max_attempts),
// Timeout (the downstream's timeout), Unique (TaskID: the idempotency
// key), Retention (store.retention), Group (none: aggregate the tasks
// before enqueueing). So is a task with headers (the adapter builds the
// handler's task without them) and one made with options
// (asynq.NewTask(type, payload, opts...)), whose options no code outside
// asynq can read: give them to Job instead.
func Job(task *asynq.Task, opts ...asynq.Option) (client.Job, error) {
	if task == nil {
		return client.Job{}, errors.New("asynqhandler.Job: the task is nil")
	}
	var errs []error
	typ := task.Type()
	if typ == "" || len(typ) > 256 || !printableASCII(typ) {
		errs = append(errs, fmt.Errorf("task type %q: throttler takes 1 to 256 printable ASCII characters", typ))
	}
	if err := payloadError(task.Payload()); err != nil {
		errs = append(errs, err)
	}
	if len(task.Headers()) > 0 {
		errs = append(errs, errors.New("the task has headers: the handler's task is built from the job without them (put what they say in the payload)"))
	}
	if n := taskOptions(task); n > 0 {
		errs = append(errs, fmt.Errorf("the task was made with %d option(s) (asynq.NewTask(type, payload, opts...)), which nothing outside asynq can read: give them to Job instead", n))
	}
	job := client.Job{Type: typ, Payload: json.RawMessage(task.Payload())}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := setOption(&job, o); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return client.Job{}, fmt.Errorf("asynqhandler.Job: task %q cannot be a throttler job as it is: %w", typ, errors.Join(errs...))
	}
	return job, nil
}

// setOption puts one asynq option's meaning into job, or says why it has
// none and which throttler setting does its work.
func setOption(job *client.Job, o asynq.Option) error {
	v := o.Value()
	switch o.Type() {
	case asynq.ProcessAtOpt:
		if t, ok := v.(time.Time); ok {
			job.NotBefore, job.Delay = t, 0
			return nil
		}
	case asynq.ProcessInOpt:
		if d, ok := v.(time.Duration); ok {
			job.NotBefore, job.Delay = time.Time{}, max(d, 0)
			return nil
		}
	case asynq.DeadlineOpt:
		if t, ok := v.(time.Time); ok {
			job.Deadline = t
			return nil
		}
	case asynq.TaskIDOpt:
		if id, ok := v.(string); ok {
			if id == "" || len(id) > 256 || !printableASCII(id) {
				return fmt.Errorf("%v: the task id is the job's idempotency key, 1 to 256 printable ASCII characters", o)
			}
			job.IdempotencyKey = id
			return nil
		}
	case asynq.QueueOpt:
		return fmt.Errorf("%v: throttler has no named queues: each tenant has its own (Enqueue's tenant), sent to the tenant's downstream (its downstream policy key)", o)
	case asynq.MaxRetryOpt:
		return fmt.Errorf("%v: attempts are the downstream's max_attempts, or the tenant's (its max_attempts policy key)", o)
	case asynq.TimeoutOpt:
		return fmt.Errorf("%v: the time an attempt may take is the downstream's timeout", o)
	case asynq.UniqueOpt:
		return fmt.Errorf("%v: give asynq.TaskID instead: it is the job's idempotency key, and a repeat of it queues nothing while the job is kept", o)
	case asynq.RetentionOpt:
		return fmt.Errorf("%v: finished jobs are kept for the server's store.retention", o)
	case asynq.GroupOpt:
		return fmt.Errorf("%v: throttler does not aggregate tasks: aggregate them before enqueueing, one job for the group", o)
	default:
		return fmt.Errorf("%v: an asynq option unknown to this adapter", o)
	}
	return fmt.Errorf("%v: its value is a %T, not what asynq's option holds", o, v)
}

// payloadError says why payload would not reach the handler as these
// bytes, nil if it would: the API carries JSON, and the client sends it
// compact, with <, > and & escaped, as json.Marshal writes it.
func payloadError(payload []byte) error {
	switch {
	case len(payload) == 0:
		return errors.New("the task has no payload: the API needs one, a JSON value the handler gets as the task's payload; give it one, such as []byte(`{}`)")
	case !json.Valid(payload) || !utf8.Valid(payload):
		return errors.New("the payload is not JSON (UTF-8): the API carries a payload as JSON; encode it as JSON, or marshal its bytes with json.Marshal (a base64 string) and unmarshal them in the handler")
	case string(payload) == "null":
		return errors.New("the payload is null: the API needs a payload (null is none); give it one, such as []byte(`{}`)")
	}
	var compact, sent bytes.Buffer
	_ = json.Compact(&compact, payload) // valid: checked above
	json.HTMLEscape(&sent, compact.Bytes())
	if !bytes.Equal(sent.Bytes(), payload) {
		return errors.New("the payload is JSON, but not as the client sends it (compact, with <, > and & escaped: as json.Marshal writes it), so the handler would get other bytes; write it with json.Marshal, or with json.Compact and json.HTMLEscape")
	}
	return nil
}

// taskOptions is how many options the task was made with (asynq keeps
// them unexported: only their number can be read; 0 if asynq's Task no
// longer has them where this looks).
func taskOptions(task *asynq.Task) int {
	f := reflect.ValueOf(task).Elem().FieldByName("opts")
	if !f.IsValid() || f.Kind() != reflect.Slice {
		return 0
	}
	return f.Len()
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
