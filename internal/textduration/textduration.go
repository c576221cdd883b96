// Package textduration gives the durations of the workflows' inputs their JSON form:
// text ("1s", "1m30s"), so that the Temporal UI shows a history's input as a person reads
// it. Histories recorded before that hold nanosecond integers; both forms are read, so
// those histories still replay.
package textduration

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Duration is a time.Duration in JSON: written as text, read from text or from an
// integer number of nanoseconds.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration must be text such as \"1s\" or \"1m30s\", got %q", s)
		}
		*d = Duration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("duration must be text such as \"1s\" or integer nanoseconds, got %s", b)
	}
	*d = Duration(n)
	return nil
}
