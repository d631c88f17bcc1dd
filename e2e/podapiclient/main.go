// Command podapiclient runs in a pod of the e2e tests (TestPodAPI): with
// client-go's in-cluster config (KUBERNETES_SERVICE_HOST/PORT, the
// service-account token and ca.crt) it GETs the paths listed, one a
// line, in a file, every second, and writes what each answered (status
// code and ConfigMap or Secret names) as JSON to another file, so that
// the test reads it on the node. Built static (CGO_ENABLED=0) and
// mounted from the host.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Answer is what one GET answered.
type Answer struct {
	Code  int      `json:"code"`
	Names []string `json:"names,omitempty"`
	Err   string   `json:"err,omitempty"`
}

// Report is one round of GETs.
type Report struct {
	Host    string            `json:"host"`
	Round   int               `json:"round"`
	Answers map[string]Answer `json:"answers"`
}

func main() {
	paths := flag.String("paths", "", "file with the paths to GET, one a line (read each round)")
	out := flag.String("out", "", "file to write each round's report to")
	ua := flag.String("user-agent", "", "User-Agent to send")
	flag.Parse()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	if *ua != "" {
		cfg.UserAgent = *ua
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	for round := 1; ; round++ {
		b, _ := os.ReadFile(*paths)
		r := Report{Host: cfg.Host, Round: round, Answers: map[string]Answer{}}
		for _, p := range strings.Fields(string(b)) {
			r.Answers[p] = get(client, cfg.Host+p)
		}
		j, _ := json.Marshal(r)
		tmp := *out + ".tmp"
		if err := os.WriteFile(tmp, j, 0o644); err == nil {
			os.Rename(tmp, *out)
		}
		time.Sleep(time.Second)
	}
}

func get(c *http.Client, url string) Answer {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return Answer{Err: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	a := Answer{Code: resp.StatusCode}
	var obj struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &obj) != nil {
		a.Err = fmt.Sprintf("body %.200q", body)
		return a
	}
	if obj.Metadata.Name != "" {
		a.Names = append(a.Names, obj.Metadata.Name)
	}
	for _, it := range obj.Items {
		a.Names = append(a.Names, it.Metadata.Name)
	}
	if resp.StatusCode != http.StatusOK {
		a.Err = obj.Message
	}
	return a
}
