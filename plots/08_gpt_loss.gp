# plots/08_gpt_loss.gp - chapter 08's training and validation loss against the step.
#
# Reads runs/08_gpt_wikitext/metrics.csv (step,epoch,train_loss,valid_loss,tokens_per_s,
# written by ./08_gpt_wikitext) and draws runs/plots/08_gpt_loss.png. A row
# holds either a training loss (the mean since the previous progress line) or
# a validation loss; the other field is empty and gnuplot skips it. The right
# axis shows perplexity = exp(loss), the number the README quotes.
# Run it from the project root:
#     gnuplot plots/08_gpt_loss.gp
#     gnuplot -e "infile='other/metrics.csv'; outfile='other.png'; subtitle='my run'" plots/08_gpt_loss.gp

if (!exists("infile")) infile = "runs/08_gpt_wikitext/metrics.csv"
if (!exists("outfile")) outfile = "runs/plots/08_gpt_loss.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . infile . "' && echo yes") ne "yes") {
    print "08_gpt_loss.gp: no " . infile . " yet (train first: cd 08_gpt_wikitext && ./08_gpt_wikitext); nothing to draw"
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
set datafile missing ""
set title "08_gpt_wikitext: cross-entropy loss" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "optimizer step"
set ylabel "loss (nats per token)"
set y2label "perplexity"
set ytics nomirror
set y2tics (2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
set link y2 via exp(y) inverse log(y)
set format y2 "%.0f"
set grid
set key top right
# A margin around the data, so that the last validation point, at the very
# last step, is drawn whole instead of cut by the frame.
set offsets graph 0.01, graph 0.03, graph 0.05, graph 0.05
plot infile skip 1 using 1:3 with lines lw 2 title "training loss", \
     infile skip 1 using 1:4 with linespoints pt 7 ps 1 lw 2 title "validation loss (whole split)"
print "08_gpt_loss.gp: wrote " . outfile
