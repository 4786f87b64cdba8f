"""CPU only: for B1's LZ4 streams (the .b1 dump of dump_cases_for_the_gpu_harness), the longest
pointer chain in each 4 KiB window with a match byte pointing at the byte d before it (plain) or
into the period before the match (periodic), and the token chain's work. python3 <this> lz4cases.bin.b1"""
import struct
raw=open(__import__('sys').argv[1],'rb').read();p=0;S=[]
while p<len(raw):
    nin,cap=struct.unpack_from('<2I',raw,p);p+=8;S.append((raw[p:p+nin],cap));p+=nin
def tokens(b):
    n=len(b);p=0;op=0;out=[]
    while True:
        t=b[p];p+=1;L=t>>4
        if L==15:
            while True:
                x=b[p];p+=1;L+=x
                if x!=255:break
        lit=p;p+=L
        if p==n: out.append((op,L,lit,0,0));break
        off=b[p]|b[p+1]<<8;p+=2;M=t&15
        if M==15:
            while True:
                x=b[p];p+=1;M+=x
                if x!=255:break
        M+=4;out.append((op,L,lit,M,off));op+=L+M
    return out
W=4096
for b,cap in S[:4]:
    toks=tokens(b)
    for periodic in (False,True):
        src=[-1]*cap  # -1 literal
        for op,L,lit,M,off in toks:
            m0=op+L
            for k in range(M):
                src[m0+k]= m0-off+(k%off if periodic else k) if periodic else m0+k-off
        # chain depth within windows
        maxd=0;tot=0;cnt=0
        depth=[0]*cap
        for x in range(cap):
            s=src[x];w0=x//W*W
            if s<0 or s<w0: depth[x]=0
            else: depth[x]=depth[s]+1
        import statistics
        ds=[max(depth[w:w+W]) for w in range(0,cap,W)]
        print(len(b),len(toks),'periodic' if periodic else 'plain','max chain per window: median',statistics.median(ds),'max',max(ds))
print('--- chain work')
def step(b,p):
    n=len(b)
    if p>=n: return 0
    t=b[p];ip=p+1;L=t>>4;M=t&15
    def ext(ip,l):
        for k in range(16):
            if ip>=n: return None
            x=b[ip];ip+=1;l+=x
            if x!=255: return ip,l
        return None
    if L==15:
        r=ext(ip,L)
        if not r: return 0
        ip,L=r
    if ip>=n or L>=n-ip: return 0
    ip+=L+2
    if M==15:
        r=ext(ip,M)
        if not r: return 0
        ip,M=r
    return ip-p if ip-p<=65535 else 0
for b,cap in S[:4]:
    n=len(b);pos=0;tile=0;hops=0;slow=0;tiles=1;cnt=0
    st={}
    def s1(q):
        if q not in st: st[q]=step(b,q)
        return st[q]
    toks=len(tokens(b))
    while cnt<toks:
        if pos-tile>=4096: tile=pos;tiles+=1
        # jump?
        at=pos;ok=True
        for j in range(8):
            if at-tile>=4096 or at>=n: ok=False;break
            s=s1(at)
            if not s: ok=False;break
            at+=s
        hops+=1
        if ok and (cnt%512)+8<=512: cnt+=8;pos=at;continue
        s=s1(pos);cnt+=1
        if s: pos+=s;continue
        slow+=1
        # full parse
        t=b[pos];q=pos+1;L=t>>4
        if L==15:
            while True:
                x=b[q];q+=1;L+=x
                if x!=255:break
        q+=L
        if q==n:break
        q+=2;M=t&15
        if M==15:
            while True:
                x=b[q];q+=1
                if x!=255:break
        pos=q
    print(n,toks,'chain hops',hops,'slow parses',slow,'tiles',tiles,'rounds',-(-toks//512),'windows',cap//4096)
