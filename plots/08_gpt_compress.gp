# plots/08_gpt_compress.gp - chapter 08's loss with the gradients all-reduced
# as fp32 and as bf16 (--grad_compress bf16, DDP's bf16_compress_hook).
#
# Reads two metrics.csv files (step,epoch,train_loss,valid_loss,tokens_per_s)
# of runs that differ only in --grad_compress, and draws their training and
# validation losses on one set of axes: where bf16's rounding of every
# gradient changes the training, the curves part. make plots measures both
# (2 ranks, the tiny preset, 300 steps) when they are missing.
# Run it from the project root:
#     gnuplot plots/08_gpt_compress.gp
#     gnuplot -e "fp32='a/metrics.csv'; bf16='b/metrics.csv'; outfile='c.png'" plots/08_gpt_compress.gp

if (!exists("fp32")) fp32 = "runs/08_gpt_compress/none/metrics.csv"
if (!exists("bf16")) bf16 = "runs/08_gpt_compress/bf16/metrics.csv"
if (!exists("outfile")) outfile = "runs/plots/08_gpt_compress.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . fp32 . "' && test -s '" . bf16 . "' && echo yes") ne "yes") {
    print "08_gpt_compress.gp: " . fp32 . " or " . bf16 . " is missing (make plots measures them); nothing to draw"
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
set title "08_gpt_wikitext: gradients all-reduced as fp32 or as bf16" . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "optimizer step"
set ylabel "loss (nats per token)"
set grid
set key top right
set offsets graph 0.01, graph 0.03, graph 0.05, graph 0.05
plot fp32 skip 1 using 1:3 with lines lw 2 lc rgb "#1f77b4" title "training loss, fp32 gradients", \
     bf16 skip 1 using 1:3 with lines lw 2 dt 2 lc rgb "#d62728" title "training loss, bf16 gradients (--grad_compress bf16)", \
     fp32 skip 1 using 1:4 with points pt 7 ps 1.2 lc rgb "#1f77b4" title "validation loss, fp32", \
     bf16 skip 1 using 1:4 with points pt 6 ps 1.8 lc rgb "#d62728" title "validation loss, bf16"
print "08_gpt_compress.gp: wrote " . outfile
