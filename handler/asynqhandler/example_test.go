package asynqhandler_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/handler/asynqhandler"
)

// A producer written for asynq enqueues through throttler's client: Job
// turns the task and its options into the job to send (with
// client.Client.Enqueue). ProcessAt schedules it; an option with no
// throttler meaning is refused, naming the setting that does its work.
func ExampleJob() {
	payload, _ := json.Marshal(map[string]string{"to": "+15550100", "text": "Your code is 4242"})
	task := asynq.NewTask("sms:otp", payload)
	at := time.Date(2026, 12, 8, 9, 0, 0, 0, time.UTC)
	job, err := asynqhandler.Job(task, asynq.ProcessAt(at), asynq.TaskID("otp-42"))
	if err != nil {
		fmt.Println(err)
		return
	}
	wire, _ := json.Marshal(job)
	fmt.Println(string(wire))

	_, err = asynqhandler.Job(task, asynq.MaxRetry(3))
	fmt.Println(err)
	// Output:
	// {"payload":{"text":"Your code is 4242","to":"+15550100"},"idempotency_key":"otp-42","not_before":"2026-12-08T09:00:00Z","type":"sms:otp"}
	// asynqhandler.Job: task "sms:otp" cannot be a throttler job as it is: MaxRetry(3): attempts are the downstream's max_attempts, or the tenant's (its max_attempts policy key)
}
