import json,sys,statistics as st
for f in sys.argv[1:]:
    try: d=json.load(open(f))
    except Exception as e: print(f, 'not ready'); continue
    for m,runs in d['runs'].items():
        h=[r['heldout_return'] for r in runs]; c=[r.get('cpu_s') for r in runs]
        print(f"{f:28s} {m:8s} held {' / '.join(f'{x:.1f}' for x in h)}  med {st.median(h):.1f}  cpu {' / '.join(f'{x:.0f}' for x in c)} med {st.median(c):.0f}")
