# plots/13_balance.gp - chapter 13: does the balancing loss balance the
# experts? The smallest and the largest share of the assignments any expert
# got, per layer, every 10 steps of training on WikiText-2, without the
# loss (aux0) and with it (aux1): an even router gives every expert 1/E.
#
# Reads two routing.csv files that 13_expert_parallel writes in --out_dir
# (step,layer,min_share,max_share,dropped,experts,aux_loss_coef,
# capacity_factor; make plots runs them). From the project root:
#     gnuplot -e "aux0='runs/13_expert_parallel/balance/aux0/routing.csv'; aux1='runs/13_expert_parallel/balance/aux0.01/routing.csv'" plots/13_balance.gp
if (!exists("aux0")) aux0 = "runs/13_expert_parallel/balance/aux0/routing.csv"
if (!exists("aux1")) aux1 = "runs/13_expert_parallel/balance/aux0.01/routing.csv"
if (!exists("outfile")) outfile = "runs/plots/13_balance.png"
if (!exists("subtitle")) subtitle = ""
if (system("test -s '" . aux0 . "' && test -s '" . aux1 . "' && echo yes") ne "yes") {
    print "13_balance.gp: no " . aux0 . " or " . aux1 . " yet (make plots measures them); nothing to draw"
    exit
}
system "mkdir -p \"$(dirname '" . outfile . "')\""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1000,560 noenhanced
} else {
    set terminal png size 1000,560
}
set termoption noenhanced
set output outfile
set datafile separator ","
E = real(system("awk -F, 'NR == 2 { print $6 }' '" . aux0 . "'"))
coef = system("awk -F, 'NR == 2 { print $7 }' '" . aux1 . "'")
set title sprintf("13_expert_parallel: the busiest and the idlest expert's share of the assignments (%d experts, even: %.1f%%)", E, 100.0 / E) . (strlen(subtitle) > 0 ? "\n" . subtitle : "")
set xlabel "training step"
set ylabel "share of the layer's assignments (%)"
set yrange [0:75] # room for the key above the lines
set grid
set key top right
# rows alternate layer 0, layer 1 (every 2::l picks one layer)
plot 100.0 / E with lines dashtype 3 linecolor rgb "gray40" title "even (1/E)", \
     for [l = 0:1] aux0 using 1:(100 * column(4)) skip 1 every 2::l with lines linecolor 1 dashtype l + 1 linewidth 2 \
         title sprintf("no balancing loss, layer %d: max", l), \
     for [l = 0:1] aux0 using 1:(100 * column(3)) skip 1 every 2::l with lines linecolor 1 dashtype l + 1 linewidth 1 \
         title sprintf("no balancing loss, layer %d: min", l), \
     for [l = 0:1] aux1 using 1:(100 * column(4)) skip 1 every 2::l with lines linecolor 2 dashtype l + 1 linewidth 2 \
         title sprintf("aux_loss_coef %s, layer %d: max", coef, l), \
     for [l = 0:1] aux1 using 1:(100 * column(3)) skip 1 every 2::l with lines linecolor 2 dashtype l + 1 linewidth 1 \
         title sprintf("aux_loss_coef %s, layer %d: min", coef, l)
