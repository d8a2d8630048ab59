import json,glob,statistics as st,sys,math
out=sys.argv[1]
def rows_of(f): return {(r['mode'],r['batch_size']):r for r in json.load(open(f))}
ws=sorted({p.split('/')[-1].split('.p')[0] for p in glob.glob(out+'/*.p*.json')})
tot={'goodput':[], 'goodput_hold':[]}; reach={'goodput':0,'goodput_hold':0}; cells=0
for w in ws:
  files=sorted(glob.glob(f'{out}/{w}.p*.json'))
  for b in [1,2,4,8]:
    pairs={'varK:goodput':[], 'varK:goodput_hold':[]}; hg=[]
    for f in files:
      R=rows_of(f)
      if ('nospec',b) not in R: continue
      statics=[m for (m,bb) in R if bb==b and (m=='nospec' or m.startswith('fixed:'))]
      best=max(statics,key=lambda m:R[(m,b)]['tokens_per_s'])  # per process best by median (approx)
      s=R[(best,b)]['tokens_per_s_by_repeat']
      for m in pairs:
        pairs[m]+=[x/y for x,y in zip(R[(m,b)]['tokens_per_s_by_repeat'],s)]
      hg+=[x/y for x,y in zip(R[('varK:goodput_hold',b)]['tokens_per_s_by_repeat'],R[('varK:goodput',b)]['tokens_per_s_by_repeat'])]
      assert all(R[(m,b)]['identical_to_nospec'] for (m,bb) in R if bb==b)
    if not hg: continue
    cells+=1
    g,h=st.median(pairs['varK:goodput']),st.median(pairs['varK:goodput_hold'])
    tot['goodput'].append(g); tot['goodput_hold'].append(h); reach['goodput']+=g>=0.97; reach['goodput_hold']+=h>=0.97
    print(f"{w} b{b} n={len(hg)} goodput {g:.3f} hold {h:.3f} hold/goodput {st.median(hg):.3f}")
for k,v in tot.items(): print(k,'geomean %.4f'%math.exp(sum(map(math.log,v))/len(v)),'reached',reach[k],'of',cells)
