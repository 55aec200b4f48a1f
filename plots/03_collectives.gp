# plots/03_collectives.gp - bus bandwidth against size, one curve per collective (chapter 03).
#
# Reads runs/03_collectives/<collective>.csv (written by `./03_collectives
# --bench`) and draws runs/plots/03_collectives.png. Run it from the project root:
#     gnuplot plots/03_collectives.gp
# The title names the device, backend, ranks and date of the run. They come
# from the comment line "# DEVICE | backend NAME | N ranks | DATE" under each
# CSV's header (the first CSV found is used); give them instead with -e:
#     gnuplot -e "info='8x H100 | backend nccl | 8 ranks | 2025-01-31'" plots/03_collectives.gp
# plots/make_plots.sh's names outfile and subtitle work as well (indir for dir).
# Rows whose busbw is 0 (size 0: the per-rank chunk of a tiny size rounds
# down to nothing) cannot sit on a log axis and are left out.

if (exists("indir")) dir = indir
if (exists("outfile")) out = outfile
if (exists("subtitle")) info = subtitle
if (!exists("dir")) dir = "runs/03_collectives"
if (!exists("out")) out = "runs/plots/03_collectives.png"
names = system("cd '" . dir . "' 2>/dev/null && for c in broadcast reduce all_reduce gather all_gather " . \
               "scatter reduce_scatter all_to_all all_to_all_v; do [ -s $c.csv ] && printf '%s ' $c; done")
if (strlen(names) == 0) {
    print "03_collectives.gp: no CSV in " . dir . " yet (run ./03_collectives/03_collectives --bench); nothing to draw"
    exit
}
if (!exists("info")) info = system("sed -n -e '/^# command:/d' -e 's/^# //p' '" . dir . "/" . word(names, 1) . ".csv' | head -n 1")
system "mkdir -p \"$(dirname '" . out . "')\""

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1000,600 font ",10"
} else {
    set terminal png size 1000,600
}
set output out
set termoption noenhanced   # names like all_reduce keep their underscores
set datafile separator ","

set title "03_collectives: bus bandwidth by collective\n" . info
set logscale x 2
set xtics ("8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, "256K" 262144, \
           "2M" 2097152, "16M" 16777216, "128M" 134217728, "1G" 1073741824)
set xlabel "size (bytes): the larger of the send and receive buffers"
set logscale y 10
set ylabel "busbw (GB/s, 1 GB = 1e9 B)"
set grid
set key left top
positive(v) = v > 0 ? v : 1/0
# Each collective keeps its own colour, point and dash, whichever are drawn:
# nine colours that stay apart for colour-blind readers too (Okabe-Ito,
# without its pale yellow, plus grey; all_to_all_v all_to_all's grey, darker),
# and shapes for a grey-scale print.
all = "broadcast reduce all_reduce gather all_gather scatter reduce_scatter all_to_all all_to_all_v"
colours = "#000000 #E69F00 #0072B2 #009E73 #D55E00 #56B4E9 #CC79A7 #7F7F7F #3F3F3F"
points = "7 5 9 11 13 4 6 8 10"
index_of(c) = sum [k=1:9] (word(all, k) eq c ? k : 0)
plot for [c in names] dir . "/" . c . ".csv" skip 1 using (positive($1)):(positive($8)) \
     with linespoints lc rgb word(colours, index_of(c)) pt int(word(points, index_of(c))) ps 0.8 \
     dt index_of(c) lw 2 title c
print "03_collectives.gp: wrote " . out
