# plots/09_zero_memory.gp - chapter 09: the bytes each rank holds against the
# number of ranks N, for DDP and the three ZeRO stages: measured (points,
# what the program counted from its allocations) beside the ZeRO paper's
# formula (dashed lines).
#
# Reads a CSV with one row per run, stage,world,params,grads,optimizer,
# gathered,activations,other,formula (bytes, rank 0; formula: the paper's
# parameters + gradients + optimizer state for that stage and N), which
# plots/make_plots.sh collects from runs/09_zero_fsdp/memory/*/memory.csv.
# The measured points are the same three kinds (model states); the gap
# above the formula in ZeRO-2 and 3 is the buffers a bucket uses while it
# is computed (zero.h, section 4). Run it from the project root:
#     gnuplot -e "infile='runs/09_zero_fsdp/memory.csv'" plots/09_zero_memory.gp
if (!exists("infile")) infile = "runs/09_zero_fsdp/memory.csv"
if (!exists("outfile")) outfile = "runs/plots/09_zero_memory.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . infile . "' && echo yes") ne "yes") {
    print "09_zero_memory.gp: no " . infile . " yet (make plots measures it); nothing to draw"
    exit
}
system "mkdir -p \"$(dirname '" . outfile . "')\""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,560 noenhanced
} else {
    set terminal png size 900,560
}
set termoption noenhanced
set output outfile
set datafile separator ","
set title "09_zero_fsdp: model states per rank (parameters + gradients + optimizer state)" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "ranks N"
set ylabel "KiB per rank"
set logscale x 2
set xtics (1, 2, 4, 8, 16)
set xrange [0.85:9.5]
set yrange [0:*]
set grid
set key bottom left
states(s) = (column(1) == s ? (column(3) + column(4) + column(5)) / 1024.0 : 1/0)
formula(s) = (column(1) == s ? column(9) / 1024.0 : 1/0)
names = "DDP ZeRO-1 ZeRO-2 ZeRO-3/FSDP"
plot for [s = 0:3] infile using 2:(formula(s)) skip 1 with lines dashtype 2 linecolor s + 1 linewidth 2 \
         title word(names, s + 1) . ": the paper's formula", \
     for [s = 0:3] infile using 2:(states(s)) skip 1 with points pointtype 7 pointsize 1.3 linecolor s + 1 \
         title word(names, s + 1) . ": measured"
