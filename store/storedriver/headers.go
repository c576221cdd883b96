package storedriver

import "encoding/json"

// ParseHeaders decodes a message's headers column. Rows written by other programs may
// hold any JSON there, so it never fails: a JSON object gives its entries whose values are
// strings (other values are left out), and anything else (an array, a scalar, null,
// malformed text, nothing) gives nil. The message is then delivered without those headers.
func ParseHeaders(data []byte) map[string]string {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil || len(raw) == 0 {
		return nil
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil { // null would give ""
			out[k] = s
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
