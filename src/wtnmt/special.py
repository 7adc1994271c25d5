"""Special token ids, fixed for every vocabulary wtnmt builds (sentencepiece is told these ids).

0 <pad>   padding; ignored by the loss, never attended to
1 <s>     beginning of sentence: the first decoder input
2 </s>    end of sentence: ends every source and every target
3 <unk>   a piece the vocabulary does not know
"""

PAD = 0
BOS = 1
EOS = 2
UNK = 3
