# plots/11_timeline.gp - chapter 11's pipeline schedule as it ran: one row
# per stage, time to the right, a box for every forward (F) and backward (B)
# pass with its micro-batch's number, and a thin bar under it for every
# send and receive (the time a stage waited for a neighbour). White space
# in a row is the bubble: that stage had nothing to compute.
#
# Reads runs/11_pipeline_parallel/timeline-SCHEDULE.csv (rank,stage,replica,shard,
# kind,micro,start_ms,end_ms: the last training step of every rank, written
# by ./11_pipeline_parallel) and draws pipeline 0 (replica 0, shard 0). Run it from
# the project root:
#     gnuplot -e "infile='runs/11_pipeline_parallel/timeline-1f1b.csv'" plots/11_timeline.gp

if (!exists("infile")) infile = "runs/11_pipeline_parallel/timeline-1f1b.csv"
if (!exists("outfile")) outfile = "runs/plots/11_timeline.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . infile . "' && echo yes") ne "yes") {
    print "11_timeline.gp: no " . infile . " yet (run cd 11_pipeline_parallel && ./11_pipeline_parallel); nothing to draw"
    exit
}
system "mkdir -p \"$(dirname '" . outfile . "')\""
# The run's line "# schedule 1f1b | stages 4 | micro_batches 8 | the last of 50 steps | bubble ..."
# names the figure: its first three fields, then the rest.
field(k) = system("sed -n 's/^# schedule //p' '" . infile . "' | head -n 1 | cut -d'|' -f" . k . " | sed 's/^ *//; s/ *$//'")
about = field(1) . ", " . field(2) . " x " . field(3) . "\n" . field("4-")
stages = int(system("sed -n 's/^# schedule .*| stages \\([0-9]*\\) .*/\\1/p' '" . infile . "' | head -n 1"))

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1000, 140 + 90 * stages noenhanced
} else {
    set terminal png size 1000, 140 + 90 * stages
}
set termoption noenhanced
set output outfile
set datafile separator ","
set title "11_pipeline_parallel: " . about . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "milliseconds since the step began"
set yrange [stages - 0.45 : -0.55]
set ytics 1
set format y "stage %.0f"
set grid xtics
set key outside bottom center horizontal
set style fill solid 0.85 border rgb "black"
set offsets graph 0.01, graph 0.01, 0, 0

is(k) = strcol(5) eq k && column(3) == 0 && column(4) == 0
plot infile skip 1 using (is("F") ? ($7 + $8) / 2 : 1/0):2:(($8 - $7) / 2):(0.3) with boxxyerror lc rgb "#4a90d9" title "forward", \
     infile skip 1 using (is("B") ? ($7 + $8) / 2 : 1/0):2:(($8 - $7) / 2):(0.3) with boxxyerror lc rgb "#5cb85c" title "backward", \
     infile skip 1 using (is("S") || is("R") ? ($7 + $8) / 2 : 1/0):($2 + 0.4):(($8 - $7) / 2):(0.06) with boxxyerror lc rgb "#bbbbbb" title "send / receive (waiting included)", \
     infile skip 1 using (is("F") || is("B") ? ($7 + $8) / 2 : 1/0):2:6 with labels notitle
print "11_timeline.gp: wrote " . outfile
