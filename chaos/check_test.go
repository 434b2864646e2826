package chaos

import (
	"reflect"
	"testing"
)

func TestExpectations(t *testing.T) {
	t.Parallel()
	acc := "accepted"
	cases := []struct {
		name  string
		items []item
		want  map[string]expectation
	}{
		{"plain events", []item{{key: "a", quantity: 5, state: acc}, {key: "b", quantity: 0, state: acc}},
			map[string]expectation{"a": {live: 5}, "b": {live: 0}}},
		{"positive correction", []item{{key: "a", quantity: 5, state: acc}, {key: "c", quantity: 3, corrects: "a", state: acc}},
			map[string]expectation{"a": {live: 5}, "c": {live: 3}}},
		{"negative correction restates the rest", []item{{key: "a", quantity: 5, state: acc}, {key: "c", quantity: -2, corrects: "a", state: acc}},
			map[string]expectation{"a": {live: 5, cancelled: true}, "c": {live: 3}}},
		{"negative correction of it all sends nothing", []item{{key: "c", quantity: -5, corrects: "a", state: acc}, {key: "a", quantity: 5, state: acc}},
			map[string]expectation{"a": {live: 5, cancelled: true}, "c": {live: 0}}},
		{"an open negative correction cancelled nothing", []item{{key: "a", quantity: 5, state: acc}, {key: "c", quantity: -2, corrects: "a", state: "pending"}},
			map[string]expectation{"a": {live: 5}, "c": {live: 3}}},
		{"a chain: the restating correction corrected again", []item{{key: "a", quantity: 5, state: acc},
			{key: "c", quantity: -2, corrects: "a", state: acc}, {key: "d", quantity: -1, corrects: "c", state: acc}},
			map[string]expectation{"a": {live: 5, cancelled: true}, "c": {live: 3, cancelled: true}, "d": {live: 2}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := expectations(c.items); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
