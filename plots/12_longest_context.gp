# plots/12_longest_context.gp - chapter 12: the bytes one rank holds for a
# training step against the block size, with cp 1, 2 and 4 (measured by
# running the chapter: 12_context_parallel/bench/longest_context.sh), and
# the memory budget per rank: where each curve crosses it is the longest
# context that budget allows. Attention's T x T probabilities make the
# curves bend upwards; cp divides every point by cp.
#
# Reads the bench's CSV (cp,block_size,held_bytes,fits; its comment line
# "# budget_bytes: B"). Run it from the project root:
#     gnuplot -e "infile='runs/12_context_parallel/longest_context.csv'" plots/12_longest_context.gp
if (!exists("infile")) infile = "runs/12_context_parallel/longest_context.csv"
if (!exists("outfile")) outfile = "runs/plots/12_longest_context.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . infile . "' && echo yes") ne "yes") {
    print "12_longest_context.gp: no " . infile . " yet (make plots measures it); nothing to draw"
    exit
}
budget = real(system("sed -n 's/^# budget_bytes: //p' '" . infile . "'")) / 1048576.0
system "mkdir -p \"$(dirname '" . outfile . "')\""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,560 noenhanced
} else {
    set terminal png size 900,560
}
set termoption noenhanced
set output outfile
set datafile separator ","
set title "12_context_parallel: what one rank holds for a step, and the longest block a budget allows" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "--block_size (tokens)"
set ylabel "MiB per rank (activations, their gradients, cp buffers)"
set yrange [0:*]
set grid
set key top left
held(c) = (column(1) == c ? column(3) / 1048576.0 : 1/0)
plot for [c in "1 2 4"] infile using 2:(held(c + 0)) skip 4 with linespoints pointtype 7 linewidth 2 title "cp " . c . ": measured", \
     budget with lines dashtype 2 linecolor rgb "black" linewidth 2 title sprintf("budget %.0f MiB per rank", budget)
