# plots/02_p2p.gp - ping-pong latency and bandwidth against message size (chapter 02_p2p).
#
# Reads runs/02_p2p/pingpong.csv (written by `./02_p2p --bench`) and draws
# runs/plots/02_p2p.png: one-way latency (left) and bandwidth (right) against
# the message size, both on log-log axes. Run it from the project root:
#     gnuplot plots/02_p2p.gp
# The title names the device, backend and date of the run. They come from the
# CSV's comment line "# DEVICE | backend NAME | DATE", which the program
# writes under the header (after "# command: ...", the command that made
# the file); any of these can be given instead with -e:
#     gnuplot -e "info='2x H100 | backend nccl | 2025-01-31'" plots/02_p2p.gp
#     gnuplot -e "csv='other.csv'; out='other.png'" plots/02_p2p.gp
# plots/make_plots.sh's names infile, outfile and subtitle work as well.

if (exists("infile")) csv = infile
if (exists("outfile")) out = outfile
if (exists("subtitle")) info = subtitle
if (!exists("csv")) csv = "runs/02_p2p/pingpong.csv"
if (!exists("out")) out = "runs/plots/02_p2p.png"
if (!exists("info")) info = system("sed -n -e '/^# command:/d' -e 's/^# //p' '" . csv . "' 2>/dev/null | head -n 1")
if (system("test -s '" . csv . "' && echo yes") ne "yes") {
    print "02_p2p.gp: no " . csv . " yet (run ./02_p2p/02_p2p --bench); nothing to draw"
    exit
}
system "mkdir -p \"$(dirname '" . out . "')\""

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1200,480 font ",10"
} else {
    set terminal png size 1200,480
}
set output out
set termoption noenhanced   # names like all_reduce keep their underscores
set datafile separator ","

# Message sizes are powers of two: label them as such.
set logscale x 2
set xtics ("8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, "256K" 262144, \
           "2M" 2097152, "16M" 16777216, "128M" 134217728, "1G" 1073741824)
set xlabel "message size (bytes)"
set grid
set key off
set logscale y 10

set multiplot layout 1,2 title "02_p2p ping-pong between two ranks: " . info
set title "one-way latency = median round trip / 2"
set ylabel "latency (us)"
plot csv skip 1 using 1:2 with linespoints pt 7 ps 0.6 lw 2

set title "bandwidth = size / latency"
set ylabel "bandwidth (GB/s, 1 GB = 1e9 B)"
plot csv skip 1 using 1:3 with linespoints pt 7 ps 0.6 lw 2 lc 2
unset multiplot
print "02_p2p.gp: wrote " . out
