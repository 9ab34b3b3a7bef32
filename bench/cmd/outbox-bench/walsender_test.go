package main

import (
	"reflect"
	"testing"
	"time"
)

func TestSummarizeWAL(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	kb := func(n int64) int64 { return n << 10 }
	for _, tc := range []struct {
		name    string
		samples []walSample
		want    WALSenderStats
	}{
		{"none", nil, WALSenderStats{Waits: map[string]float64{}}},
		{
			"never behind",
			[]walSample{{at(0), kb(4), kb(1), "CPU"}, {at(50), kb(8), kb(2), "Activity:WalSenderWaitForWAL"}},
			WALSenderStats{Samples: 2, NotSentP50KB: 4, NotSentP99KB: 8, NotSentMaxKB: 8, UnconfP50KB: 1, UnconfP99KB: 2, UnconfMaxKB: 2,
				Waits: map[string]float64{"CPU": 0.5, "Activity:WalSenderWaitForWAL": 0.5}},
		},
		{
			// Two waves: 50-150 ms (three samples) and a lone one at 300 ms.
			"two waves",
			[]walSample{
				{at(0), kb(10), 0, "CPU"},
				{at(50), kb(300), 0, "Client:WalSenderWriteData"},
				{at(100), kb(900), 0, "Client:WalSenderWriteData"},
				{at(150), kb(500), 0, "CPU"},
				{at(200), kb(20), 0, "CPU"},
				{at(250), kb(256), 0, "CPU"}, // at the threshold: not behind
				{at(300), kb(400), 0, "CPU"},
				{at(350), kb(2), 0, "CPU"},
			},
			WALSenderStats{Samples: 8, NotSentP50KB: 256, NotSentP99KB: 900, NotSentMaxKB: 900,
				BehindShare: 0.5, BehindSpans: 2, LongestBehind: 100,
				Waits:       map[string]float64{"CPU": 0.75, "Client:WalSenderWriteData": 0.25},
				WaitsBehind: map[string]float64{"CPU": 0.5, "Client:WalSenderWriteData": 0.5}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarizeWAL(tc.samples); !reflect.DeepEqual(*got, tc.want) {
				t.Fatalf("summarizeWAL:\n got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func TestWaitsText(t *testing.T) {
	got := waitsText(map[string]float64{"CPU": 0.25, "Client:WalSenderWriteData": 0.7, "Activity:WalSenderMain": 0.05})
	if want := "Client:WalSenderWriteData 70%, CPU 25%, Activity:WalSenderMain 5%"; got != want {
		t.Fatalf("waitsText = %q, want %q", got, want)
	}
}
